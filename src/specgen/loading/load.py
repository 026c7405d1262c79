"""Turn a profile into a loaded target and draft: find the files (sources.py), verify and
convert them (convert.py), check the tokenizers match and the memory fits (memory.py), then
load with the asked dtype, quantization and device (devices.py), and prepare each model for
its role on the CPU (kernels.prepare)."""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from specgen.choices import BNB_SCHEMES, CPU_SCHEMES, MODEL_METHODS
from specgen.decoding import llamacpp
from specgen.errors import ConfigError, ModelError, ResourceError
from specgen.kernels import prepare
from specgen.loading.convert import convert_gguf, converted_dir, is_complete, locate, locate_gguf
from specgen.loading.devices import dtype_name, resolve_device, resolve_dtype
from specgen.loading.memory import (OVERHEAD, check_memory, estimate_bytes, free_bytes,
                                    loading_peak, smaller_profiles)
from specgen.loading.sources import (Progress, Source, fetch_weights, is_gguf, load_config,
                                     load_tokenizer, say)
from specgen.paths import cache_dir
from specgen.profiles import ModelSpec, Profile


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
    target_key: str = ""  # the target's weights and dtype (what tuned skip sets are kept by)


def context_limit(model: PreTrainedModel | llamacpp.LlamaCppDraft) -> int | None:
    """The most positions the model takes (None when its config does not say)."""
    if isinstance(model, llamacpp.LlamaCppDraft):
        return model.llm.n_ctx()
    return model.config.get_text_config().max_position_embeddings


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


def bnb_config(quantization: str, dtype: torch.dtype):
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


def _weights_key(source: Source, dtype: torch.dtype, declared: str | None = None) -> str:
    """The sha256 of a GGUF source (or `declared`, the profile's sha256 of the GGUF whose
    converted copy `source` may already be), else the weight files' paths, sizes and times."""
    ident = source.sha256 or declared
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
        out = converted_dir(source.sha256, dtype)
        if not is_complete(out, source.sha256, dtype):  # the other role may have just made it
            convert_gguf(source, dtype, spec.trust_remote_code, progress)
        source.path, source.gguf = out, None
    fetch_weights(source, progress)
    kwargs = {"dtype": dtype, "trust_remote_code": spec.trust_remote_code,
              "device_map": _device_map(device)}
    if spec.quantization in BNB_SCHEMES:
        kwargs["quantization_config"] = bnb_config(spec.quantization, dtype)
    what = f" in {spec.quantization}" if spec.quantization != "none" else ""
    say(progress, f"Loading {role} {source.name}{what} on {device}")
    try:
        model = AutoModelForCausalLM.from_pretrained(source.path, **kwargs)
    except (OSError, ValueError) as e:
        raise ModelError(f"Cannot load {source.name}: {e}") from None
    scheme, cache = "none", None
    if spec.quantization in CPU_SCHEMES:
        # The packed weights are cached, keyed by the source weights' identity and dtype, so
        # only the first load pays for quantizing.
        scheme, cache = spec.quantization, (cache_dir() / "quantized", _weights_key(source, dtype))
    prepare(model, role, scheme, cache)
    return model.eval()


def load_llama_draft(source: Source, progress: Progress | None = None) -> llamacpp.LlamaCppDraft:
    """The GGUF draft on llama.cpp's CPU kernels, with as many threads as torch uses."""
    say(progress, f"Loading draft {source.name} in llama.cpp on cpu")
    return llamacpp.load_draft(source.path / source.gguf, torch.get_num_threads())


def load_pair(profile: Profile, progress: Progress | None = None, peer_draft: bool = False
              ) -> LoadedPair:
    """Locate, check (tokenizers, memory) and load the profile's target and draft. With
    `peer_draft`, a draft that runs in llama.cpp is also loaded in transformers (as its dtype
    and quantization say), for `specgen bench`'s peer."""
    start = time.perf_counter()
    base = profile.path.parent if profile.path else None
    roles = [("target", profile.target)]
    if profile.draft is not None and profile.speculation.method in MODEL_METHODS:
        roles.append(("draft", profile.draft))
    for role, spec in roles:
        if spec.trust_remote_code:
            warnings.warn(f"{role} {spec.model}: trust_remote_code = true runs Python code from "
                          "the model's repository on this machine.", stacklevel=2)
        if spec.quantization in BNB_SCHEMES:
            bnb_config(spec.quantization, torch.float32)  # fail early if bitsandbytes is missing

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
            raise ResourceError(f"{e} {smaller_profiles(free, profile.name)}") from None

    # Before loading converts a GGUF. A GGUF target is known by its sha256, also when `locate`
    # found its converted copy, whose file times change each time the copy is made again.
    key = _weights_key(sources["target"], dtypes["target"],
                       profile.target.sha256 if is_gguf(profile.target) else None)
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
        load_seconds=time.perf_counter() - start, target_key=key,
    )
