"""specgen's own Llama-family tree (models/llama.py): a checkpoint mapped onto it computes,
through the lean decoder, transformers' logits to the last bit, and a command that only
generates never imports transformers' model code."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from specgen.decoding import HFDecoder, LeanDecoder, make_decoder
from specgen.errors import ModelError
from specgen.kernels import prepare
from specgen.loading import mapped
from specgen.models import config as config_values, llama


def target_steps(decoder, ids: torch.Tensor) -> list[torch.Tensor]:
    """A target's life: the prompt's pass, verify passes, rejected drafts dropped, a cache
    that grows."""
    out = [decoder.logits(ids[:7], 1), decoder.logits(ids[7:12], 5), decoder.logits(ids[12:13], 1)]
    decoder.crop(9)
    out += [decoder.logits(ids[9:14], 5), decoder.logits(ids[14:300], 3)]
    decoder.crop(290)
    out.append(decoder.logits(ids[290:291], 1))
    return out


VARIANTS = {  # config overrides: what the tree must honour
    "plain": {},
    "tied": {"tie_word_embeddings": True},
    "llama3-rope": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64}},
    "biases": {"attention_bias": True, "mlp_bias": True},
}


def saved(tiny_model, tmp_path, family: str, variant: str, dtype: torch.dtype):
    overrides = dict(VARIANTS[variant])
    if variant == "biases" and family == "qwen2":
        overrides = {}  # Qwen2's q/k/v always have biases, its others never
    tiny_model(family, vocab=64, hidden=64, layers=2, **overrides).to(dtype).save_pretrained(
        tmp_path / "m")
    # The reference is loaded as specgen loads it otherwise (its rotary tables in float32).
    return AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=dtype), tmp_path / "m"


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("quantization", ["float32", "bfloat16", "int8-dyn", "int4-dyn"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@torch.inference_mode()
def test_a_checkpoint_on_the_tree_gives_transformers_logits_bit_for_bit(
        family, quantization, variant, tiny_model, tmp_path):
    if family == "qwen2" and variant == "llama3-rope":
        pytest.skip("a Llama rope kind")
    dtype = torch.bfloat16 if quantization == "bfloat16" else torch.float32
    reference, folder = saved(tiny_model, tmp_path, family, variant, dtype)
    config = reference.config
    assert config_values.builds(config)
    tree = mapped.load(folder, config, dtype)
    assert isinstance(tree, llama.CausalLM) and tree.dtype == dtype
    if variant == "tied":
        assert tree.lm_head.weight is tree.model.embed_tokens.weight
    scheme = quantization if quantization.endswith("-dyn") else "none"
    for model in (reference, tree):
        prepare(model, "target", scheme)
    decoder = make_decoder(tree, exact=True)
    assert isinstance(decoder, LeanDecoder) and decoder.rows
    ids = torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(1))
    for got, want in zip(target_steps(decoder, ids), target_steps(HFDecoder(reference), ids),
                         strict=True):
        assert got.shape == want.shape and torch.equal(got, want)


@pytest.mark.parametrize("scheme", ["int8-dyn", "int4-dyn"])
@torch.inference_mode()
def test_a_packed_model_maps_onto_the_tree_and_computes_what_transformers_skeleton_does(
        scheme, tiny_model, tmp_path):
    model = tiny_model("qwen2", vocab=64, hidden=64, layers=2)
    model.config.save_pretrained(tmp_path)
    prepare(model, "target", scheme)
    mapped.save_packed(model, tmp_path)
    tree = mapped.load_packed(tmp_path, torch.float32, True, lean=scheme)
    plain = mapped.load_packed(tmp_path, torch.float32, True)
    assert isinstance(tree, llama.CausalLM) and not isinstance(plain, llama.CausalLM)
    assert tree.generation_config is not None
    for m in (tree, plain):
        prepare(m, "target", scheme)
    ids = torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(2))
    for got, want in zip(target_steps(make_decoder(tree, exact=True), ids),
                         target_steps(make_decoder(plain, exact=True), ids), strict=True):
        assert torch.equal(got, want)


READ = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "max_position_embeddings",
        "tie_word_embeddings", "hidden_act", "rope_parameters", "pad_token_id", "eos_token_id",
        "bos_token_id", "head_dim", "attention_bias", "mlp_bias", "use_sliding_window", "pretraining_tp")


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_config_transformers_saved_reads_as_plain_values_equal_to_its_own(family, variant, tiny_model,
                                                                               tmp_path):
    """A config read without transformers (models/config.py) answers every attribute specgen
    reads as transformers' config does, and the tree built from it is the same; a config it
    cannot vouch for (moving rotary angles, a missing value, remote code) is left to
    transformers."""
    from transformers import AutoConfig, GenerationConfig

    if family == "qwen2" and variant == "llama3-rope":
        pytest.skip("a Llama rope kind")
    reference, folder = saved(tiny_model, tmp_path, family, variant, torch.float32)
    want = AutoConfig.from_pretrained(folder)
    got = config_values.read(folder)
    if variant == "llama3-rope":
        assert got is None
        return
    for attr in READ:
        assert getattr(got, attr, None) == getattr(want, attr, None), attr
    trees = [llama.CausalLM(c) for c in (got, want)]
    assert [(n, p.shape) for n, p in trees[0].named_parameters()] == [
        (n, p.shape) for n, p in trees[1].named_parameters()]
    assert torch.equal(trees[0].model.rotary_emb.inv_freq, trees[1].model.rotary_emb.inv_freq)
    settings = mapped.generation_config(folder, got)
    assert settings.eos_token_id == GenerationConfig.from_pretrained(folder).eos_token_id
    (folder / "generation_config.json").unlink(missing_ok=True)  # then the config's own
    assert mapped.generation_config(folder, got).eos_token_id == GenerationConfig.from_model_config(
        want).eos_token_id
    values = json.loads((folder / "config.json").read_text())
    for change in ({"rms_norm_eps": None}, {"auto_map": {"AutoConfig": "x.Y"}}, {"model_type": "gpt2"}):
        edited = {**values, **change}
        (folder / "config.json").write_text(json.dumps({k: v for k, v in edited.items() if v is not None}))
        assert config_values.read(folder) is None, change


def test_what_the_tree_does_not_compute_keeps_transformers(tiny_model, tmp_path):
    assert not config_values.builds(tiny_model("qwen2", use_sliding_window=True, sliding_window=4).config)
    dynamic = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    assert not config_values.builds(tiny_model("llama", rope_parameters=dynamic).config)
    model, folder = saved(tiny_model, tmp_path, "llama", "plain", torch.float32)
    assert not mapped.fits(model.config, "target", torch.float16, "none", "cpu", False)
    assert not mapped.fits(model.config, "target", torch.float32, "int8-wo", "cpu", False)
    assert not mapped.fits(model.config, "draft", torch.float32, "none", "cpu", True)
    assert mapped.fits(model.config, "draft", torch.float16, "none", "cpu", False)
    # A checkpoint that lacks a tensor does not map: the caller loads transformers' class.
    weights = folder / "model.safetensors"
    read = mapped.Reader(weights)
    kept = {n: read(n).clone() for n in read.names() if n != "model.norm.weight"}
    del read
    mapped.write_tensors(weights, kept)
    assert mapped.load(folder, model.config, torch.float32) is None


def test_a_tree_target_that_cannot_verify_exactly_is_refused_not_run_wrong(tiny_model):
    config = tiny_model("qwen2").config
    tree = llama.CausalLM(config, torch.float32)
    with pytest.raises(ModelError, match="lean decoder"):
        make_decoder(tree, exact=True)  # unprepared: its layers do not compute rows alone
    with pytest.raises(TypeError, match="no forward"):
        tree(torch.zeros(1, 1, dtype=torch.long))


def test_run_generates_without_importing_transformers(tiny_profile, tmp_path):
    """`specgen run` on a fp32 pair held in specgen's cache, in a fresh interpreter: the first
    run keeps the tokenizer's copy (transformers loads it once); on the next the answer comes
    and neither transformers (config, tokenizer, model code) nor torch's compiler (which
    initialising modules on the meta device imports) was imported."""
    import shutil

    cache = tmp_path / "cache"
    for name in ("target", "draft"):
        shutil.copytree(tiny_profile.parent / name, cache / "models" / name)
    profile = tmp_path / "cached.toml"
    profile.write_text(tiny_profile.read_text().replace(str(tiny_profile.parent), str(cache / "models")))
    code = (
        "import sys, json\n"
        "from specgen.cli import app\n"
        "try:\n"
        f"    app(['run', '-p', {str(profile)!r}, '-n', '6', '--format', 'json', 'hello'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "mods = [m for m in sys.modules if m.split('.')[0] == 'transformers' or m == 'torch._dynamo']\n"
        "print(json.dumps(mods))\n"
    )
    src = str(Path(llama.__file__).parents[2])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": src, "OMP_NUM_THREADS": "1",
           "SPECGEN_STATS_DB": str(tmp_path / "history.sqlite3"), "SPECGEN_CACHE_DIR": str(cache)}
    answers, imported = [], []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        lines = done.stdout.strip().splitlines()
        # the ids: whether a token came drafted or as the bonus rides on the planner's
        # timings, the ids do not
        answers.append([t["id"] for t in json.loads(lines[0])["tokens"]])
        imported.append(json.loads(lines[-1]))
    assert "transformers" in imported[0]  # the first run compared the tokenizer's copy
    assert imported[1] == [] and answers[1] == answers[0] and answers[0]


@pytest.mark.parametrize("scheme", ["none", "int8-dyn", "int4-dyn"])
def test_a_lean_session_runs_on_the_tree_and_answers_as_transformers_classes_do(
        scheme, tiny_profile, isolated_cache):
    """The session `run` opens (lean) builds both models on the tree, float or packed from
    the cache, and gives the greedy answer of the session the Python API opens (transformers'
    classes) token for token."""
    from specgen.app.session import open_session
    from specgen.profiles import load_profile, with_overrides

    profile = with_overrides(load_profile(str(tiny_profile)), temperature=0.0, max_new_tokens=12,
                             target_quantization=scheme, draft_quantization=scheme)
    lean, plain = open_session(profile, lean=True), open_session(profile)
    for pair, tree in ((lean.pair, True), (plain.pair, False)):
        assert isinstance(pair.target, llama.CausalLM) is tree
        assert isinstance(pair.draft, llama.CausalLM) is tree
    ids = torch.tensor([5, 9, 2, 7, 3])
    answers = [s.generator.generate(ids, max_new_tokens=12).token_ids for s in (lean, plain)]
    assert answers[0] == answers[1] and len(answers[0]) == 12
