"""A GGUF file run as stored (quantization "gguf", loading/stored.py): its blocks mapped and
computed in place, nothing converted, and greedy speculation exactly the file's own greedy
decoding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from specgen.cli import app
from specgen.decoding.lean import LeanDecoder, Skip
from specgen.errors import ConfigError, ModelError
from specgen.kernels import gguf as kernels, prepare
from specgen.loading import cache, stored
from specgen.profiles import load_profile

IDS = [5, 9, 17, 3, 40, 41, 12, 8, 33, 21]
SRC = str(Path(stored.__file__).parents[2])


def write(tiny_gguf, folder: Path, **kwargs) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return tiny_gguf(folder / "m.gguf", hidden=64, ff=128, **kwargs)


def lean(path: Path, role: str = "target") -> LeanDecoder:
    return LeanDecoder(prepare(stored.load(path), role, "gguf"))


@pytest.mark.parametrize("arch, kind, tolerance", [("llama", "F32", 1e-4), ("qwen2", "Q8_0", 0.03),
                                                   ("qwen2", "Q4_0", 0.05)])
def test_the_files_blocks_compute_what_transformers_computes_from_them(
        tmp_path, tiny_gguf, arch, kind, tolerance):
    """Against transformers' own GGUF loader (which dequantizes, and puts a llama file's q/k
    rows back in its order): the same model, up to the activations' int8 rounding."""
    from transformers import AutoModelForCausalLM

    path = write(tiny_gguf, tmp_path, arch=arch, kind=kind, scale=0.3)
    ours = lean(path).logits(torch.tensor(IDS), len(IDS))
    reference = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=torch.float32)
    theirs = reference(torch.tensor([IDS])).logits[0]
    error = (ours - theirs).norm() / theirs.norm()
    assert error < tolerance, float(error)
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.9


def test_the_config_comes_from_the_files_metadata(tmp_path, tiny_gguf):
    config = stored.read_config(stored.File(write(tiny_gguf, tmp_path, arch="qwen2", kind="Q8_0")))
    assert (config.model_type, config.hidden_size, config.intermediate_size) == ("qwen2", 64, 128)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert (config.vocab_size, config.num_hidden_layers, config.eos_token_id) == (64, 2, 2)
    assert not config.tie_word_embeddings


def test_the_files_layout_is_read_as_ggufs_own_reader_reads_it(tmp_path, tiny_gguf):
    """Every scalar and string of the metadata, and every tensor's type, shape and bytes, as
    the gguf package's reader finds them: the tokenizer's arrays (strings, integers, floats)
    skipped between them without a byte out of place."""
    import gguf

    path = write(tiny_gguf, tmp_path, arch="qwen2", kind="Q8_0", merges=("a a", "b b", "aa b"))
    ours = stored.File(path)
    reader = gguf.GGUFReader(path)
    scalars = {name: field.contents() for name, field in reader.fields.items()
               if field.types[0] != gguf.GGUFValueType.ARRAY and not name.startswith("GGUF.")}
    assert ours.fields == pytest.approx(scalars) and "tokenizer.ggml.model" in ours.fields
    assert set(ours.tensors) == {t.name for t in reader.tensors}
    for t in reader.tensors:
        mine = ours.tensors[t.name]
        assert (mine.kind, mine.k, mine.n) == (t.tensor_type.name, int(t.shape[0]),
                                               int(np.prod(t.shape[1:])))
        assert mine.data.tobytes() == np.asarray(t.data).tobytes()


def test_ggmls_type_ids_for_the_kernels_formats_are_the_gguf_packages():
    import gguf

    for type_id, name in stored._KINDS.items():
        kind = gguf.GGMLQuantizationType(type_id)
        assert kind.name == name
        fmt = kernels.FORMATS[name]
        assert gguf.GGML_QUANT_SIZES[kind] == (fmt.block_weights, fmt.block_bytes)
    assert set(stored._KINDS.values()) == set(kernels.FORMATS)


def test_a_file_of_the_kernels_formats_opens_without_the_gguf_package(tmp_path, tiny_gguf):
    """The package's import (YAML and more) is left to files of other types."""
    path = write(tiny_gguf, tmp_path, arch="qwen2", kind="Q8_0")
    code = ("import sys\nfrom pathlib import Path\nfrom specgen.loading import stored\n"
            f"assert stored.File(Path({str(path)!r})).tensors\nprint('gguf' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_every_row_of_a_verify_pass_is_a_one_token_pass(tmp_path, tiny_gguf):
    decoder = lean(write(tiny_gguf, tmp_path, arch="qwen2", kind="Q8_0"))
    decoder.logits(torch.tensor(IDS[:4]), 1)
    wide = decoder.logits(torch.tensor(IDS[4:]), len(IDS) - 4)
    decoder.crop(4)
    one = torch.cat([decoder.logits(torch.tensor([i]), 1) for i in IDS[4:]])
    assert torch.equal(wide, one)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0"])
def test_a_layer_in_one_call_has_the_bits_of_its_pass_op_by_op(tmp_path, tiny_gguf, kind):
    """gguf.Layer (a decoder layer in one kernel call) gives every row the bits of the lean
    decoder's loop of ops (run_layers, which trees take): a prompt's pass, one-token passes,
    and passes that leave sub-layers out (a self-speculative draft's)."""
    model = prepare(stored.load(write(tiny_gguf, tmp_path, arch="qwen2", kind=kind)), "target", "gguf")
    one_call, op_by_op = LeanDecoder(model), LeanDecoder(model)
    assert one_call.one_call is not None
    op_by_op.one_call = None
    skip = Skip(attention=frozenset({1}), mlp=frozenset({0}))
    for decoder in (one_call, op_by_op):
        decoder.got = [decoder.logits(torch.tensor(IDS[:6]), 6)]
        decoder.got += [decoder.logits(torch.tensor([i]), 1) for i in IDS[6:]]
        decoder.crop(6)
        decoder.got.append(decoder.logits(torch.tensor(IDS[6:]), 4, skip))
    for got, want in zip(one_call.got, op_by_op.got, strict=True):
        assert torch.equal(got, want)


def test_the_weights_stay_in_the_files_mapping(tmp_path, tiny_gguf):
    path = write(tiny_gguf, tmp_path, arch="qwen2", kind="Q8_0")
    model = stored.load(path)
    layer = model.model.layers[0].mlp.down_proj
    assert layer.weight.kind == "Q8_0"
    assert not any(p.numel() > 64 * 64 for p in model.parameters())  # norms and biases only
    start = model.file.map.ctypes.data
    assert start <= layer.weight.data.data_ptr() < start + path.stat().st_size


def test_the_kernel_is_built_before_the_first_pass(tmp_path, tiny_gguf, monkeypatch):
    """A first run compiles gguf.c (seconds): inside a pass, that time would stand in the
    planner's costs as what the model's passes cost."""
    from specgen.kernels import build

    path = write(tiny_gguf, tmp_path, arch="qwen2", kind="Q8_0")
    monkeypatch.setattr(build, "_loaded", {})  # as in a new process
    stored.load_gguf(path)
    assert build.loaded(kernels.STEM)


def test_a_model_the_tree_does_not_build_is_one_clear_line(tmp_path, tiny_gguf):
    import gguf

    path = tmp_path / "g.gguf"
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_tensor("token_embd.weight", torch.zeros(4, 32).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="'gemma3' model.*quantization = \"none\""):
        stored.read_config(stored.File(path))
    (tmp_path / "junk.gguf").write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ModelError, match="not a GGUF file"):
        stored.File(tmp_path / "junk.gguf")


def test_a_gguf_entry_runs_as_stored_unless_told(tmp_path):
    def profile(extra: str = "", model: str = "m.gguf") -> str:
        p = tmp_path / "p.toml"
        p.write_text(f'[target]\nmodel = "{tmp_path / model}"\n{extra}')
        return load_profile(str(p)).target.quantization

    assert profile() == "gguf"
    assert profile('quantization = "none"') == "none"
    assert profile('device = "cuda"') == "none"  # the kernels are the CPU's
    with pytest.raises(ConfigError, match="names none"):
        profile('quantization = "gguf"', model="folder")
    with pytest.raises(ConfigError, match="runs on the CPU"):
        profile('quantization = "gguf"\ndevice = "cuda"')


@pytest.fixture(scope="module")
def stored_pair(tmp_path_factory, tiny_gguf) -> Path:
    root = tmp_path_factory.mktemp("stored")
    target = write(tiny_gguf, root / "target", arch="qwen2", kind="Q8_0", scale=0.3)
    draft = write(tiny_gguf, root / "draft", arch="qwen2", kind="Q8_0", scale=0.3, layers=1)
    profile = root / "pair.toml"
    profile.write_text(f'[target]\nmodel = "{target}"\n[draft]\nmodel = "{draft}"\n'
                       '[speculation]\nmethod = "draft-model"\nadaptive = false\n'
                       'num_speculative_tokens = 3\n')
    return profile


def test_greedy_speculation_is_the_files_own_greedy_decoding(stored_pair, tmp_path, monkeypatch):
    from specgen.loading import load

    def no_conversion(*args, **kwargs):
        raise AssertionError("a GGUF run as stored was converted")

    monkeypatch.setattr(load, "convert_gguf", no_conversion)
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))

    def run(*args: str) -> dict:
        result = CliRunner().invoke(app, ["run", "-p", str(stored_pair), "--format", "json",
                                          "-n", "24", *args, "abcabcab"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    spec, plain = run(), run("--k", "0")
    assert [t["id"] for t in spec["tokens"]] == [t["id"] for t in plain["tokens"]]
    assert spec["stats"]["proposed"] > 0 and plain["stats"]["proposed"] == 0
    manifests = list((tmp_path / "cache").rglob(cache.MANIFEST))
    assert manifests  # the tokenizer's copy
    kinds = {json.loads(m.read_text()).get("kind") for m in manifests}
    assert kinds == {"tokenizer"}, kinds  # no converted or packed weights


def test_a_ggufs_tokenizer_is_read_from_the_file_once_and_kept_as_one_copy(
        stored_pair, tmp_path, monkeypatch):
    """Reading a GGUF's tokenizer from its metadata is slow: the first load reads each file's
    once and keeps it as one entry, the fast copy itself; later loads read neither file."""
    from specgen.loading import load, tokenizer_cache

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    slow = []
    real = tokenizer_cache.from_pretrained

    def counted(cls, source, *args):
        slow.append(Path(source.name).parent.name)
        return real(cls, source, *args)

    monkeypatch.setattr(tokenizer_cache, "from_pretrained", counted)
    said = []
    first = load.load_pair(load_profile(str(stored_pair)), said.append).tokenizer
    assert sorted(slow) == ["draft", "target"], slow  # each file once, no folder after it
    reading = [m for m in said if m.startswith("Reading the tokenizer of")]
    assert len(reading) == 2 and all(m.endswith("(first run only)") for m in reading), said
    entries = [p for p in (tmp_path / "cache" / tokenizer_cache.FOLDER).iterdir()
               if not p.name.startswith(".")]
    assert len(entries) == 2, entries
    slow.clear()
    said.clear()
    second = load.load_pair(load_profile(str(stored_pair)), said.append, lean=True).tokenizer
    assert slow == [] and isinstance(second, tokenizer_cache.PlainTokenizer)
    assert not [m for m in said if m.startswith("Reading the tokenizer")], said
    assert second.get_vocab() == first.get_vocab()
    assert second("abcabcab")["input_ids"] == first("abcabcab")["input_ids"]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_ggufs_tokenizer_class_is_named_from_its_header_as_autotokenizer_picks_it(
        tmp_path, tiny_gguf, monkeypatch, arch):
    """AutoTokenizer reads all of a GGUF's metadata with gguf's reader (seconds for a real
    vocabulary) only to learn its model type; the class named from specgen's read of the
    header is the one AutoTokenizer picks, and builds the same tokenizer without that read."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoTokenizer

    from specgen.loading import tokenizer_cache
    from specgen.loading.sources import ModelFiles

    path = write(tiny_gguf, tmp_path, arch=arch, kind="Q8_0")
    source = ModelFiles("m", path.parent, path.name)
    slow = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)

    def whole_read(*args, **kwargs):
        raise AssertionError("the whole metadata read")

    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", whole_read)
    with pytest.raises(AssertionError, match="whole metadata"):  # AutoTokenizer's way reads it
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    named = tokenizer_cache.gguf_tokenizer_class(source)
    fast = named.from_pretrained(path.parent, gguf_file=path.name)
    assert type(fast) is type(slow)
    assert fast.backend_tokenizer.to_str() == slow.backend_tokenizer.to_str()
    assert fast("abcabcab def")["input_ids"] == slow("abcabcab def")["input_ids"]
    (tmp_path / "tokenizer_config.json").write_text("{}")  # AutoTokenizer reads it: its own way
    assert tokenizer_cache.gguf_tokenizer_class(source) is None


def test_a_ggufs_refused_tokenizer_copy_loads_the_slow_way_from_its_files(
        stored_pair, tmp_path, monkeypatch):
    """A copy that would not answer the same keeps its files (the only copy of the file's
    tokenizer): later loads read them as transformers does, never the fast or plain way."""
    from specgen.loading import load, tokenizer_cache

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tokenizer_cache, "difference", lambda slow, fast: "refused here")
    first = load.load_pair(load_profile(str(stored_pair))).tokenizer
    monkeypatch.setattr(tokenizer_cache, "from_pretrained", None)  # the file is not read again
    second = load.load_pair(load_profile(str(stored_pair)), lean=True).tokenizer
    assert type(second) is type(first) and not isinstance(second, tokenizer_cache.PlainTokenizer)
    assert second.get_vocab() == first.get_vocab()
    assert second("abcabcab")["input_ids"] == first("abcabcab")["input_ids"]


def test_a_gguf_drafts_output_layer_cut_to_its_first_rows_is_a_view(tmp_path, tiny_gguf):
    from specgen.core.drafters import trimmed_output

    model = prepare(stored.load(write(tiny_gguf, tmp_path, arch="qwen2", kind="Q8_0")), "draft", "gguf")
    head = trimmed_output(model, 40)
    assert head is not None and head.layer.weight.n == 40
    assert head.layer.weight.data.data_ptr() == model.lm_head.weight.data.data_ptr()
    hidden = torch.randn(3, 64)
    assert torch.equal(head(hidden), model.lm_head(hidden)[:, :40])


def test_the_python_api_runs_gguf_files_as_the_command_line_does(stored_pair):
    """SpeculativeGenerator given two GGUF files (load_gguf) drafts, and its greedy output is
    the target file's own plain decoding."""
    import specgen

    files = sorted(stored_pair.parent.rglob("m.gguf"))  # draft/, target/
    target, draft = specgen.load_gguf(files[1]), specgen.load_gguf(files[0], "draft")
    prompt = torch.tensor([5, 9, 17, 3, 40])
    spec = specgen.SpeculativeGenerator(target, draft, num_speculative_tokens=3).generate(
        prompt, max_new_tokens=20)
    plain = specgen.SpeculativeGenerator(target, draft, num_speculative_tokens=0).generate(
        prompt, max_new_tokens=20)
    assert spec.token_ids == plain.token_ids and spec.stats.proposed > 0
    with pytest.raises(ModelError, match="does not exist"):
        specgen.load_gguf(stored_pair.parent / "nope.gguf")


@pytest.mark.parametrize("ready", [False, True])
def test_a_first_run_says_it_compiles_the_kernels_before_mapping(monkeypatch, tmp_path, ready):
    """gguf.c's compile is the first run's longest wait: it gets a status line of its own,
    not the mapping's, and only where the kernel is not compiled yet."""
    from specgen.loading import load
    from specgen.loading.plan import RolePlan
    from specgen.loading.sources import ModelFiles
    from specgen.profiles import ModelSpec

    said = []
    monkeypatch.setattr(kernels, "compiled", lambda: ready)
    monkeypatch.setattr(kernels, "library", lambda: said.append("compiled"))
    monkeypatch.setattr(stored, "load_gguf", lambda path, role: said.append(f"mapped {path.name}"))
    plan = RolePlan("target", ModelSpec(model=str(tmp_path / "m.gguf"), quantization="gguf"),
                    "stored", "cpu", torch.float32, ModelFiles("m", tmp_path, gguf="m.gguf"))
    load.load_role(plan, said.append)
    compiling = ["Compiling specgen's GGUF kernels (once for this version, up to a minute)",
                 "compiled"]
    assert said == [*([] if ready else compiling),
                    "Mapping target m as stored in m.gguf", "mapped m.gguf"]
