"""Turn a profile into a loaded target and draft: find the files (sources.py), verify and
convert them (convert.py), check the tokenizers match and the memory fits (memory.py), then
load with the asked dtype, quantization and device (devices.py), and prepare each model for
its role on the CPU (kernels.prepare)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specgen.choices import (BNB_SCHEMES, CPU_SCHEMES, GPU_SCHEMES, HEAD_KINDS, MODEL_METHODS,
                             STORED_SCHEME)
from specgen.decoding import llamacpp
from specgen.errors import ConfigError, ModelError, ResourceError, SpecgenWarning
from specgen.kernels import cuda_int4, prepare
from specgen.loading import cache, mapped, stored, tokenizer_cache
from specgen.loading.convert import ABSENT, convert_gguf, ensure_packed, locate, locate_gguf, problem_of
from specgen.loading.devices import dtype_name, resolve_device, resolve_dtype
from specgen.loading.memory import (OVERHEAD, check_memory, estimate_bytes, free_bytes,
                                    loading_peak, smaller_profiles)
from specgen.loading.sources import (Progress, Source, fetch_weights, find_head, gguf_tokenizer,
                                     load_config,
                                     load_tokenizer, pretrained, refused_code, say)
from specgen.profiles import ModelSpec, Profile

if TYPE_CHECKING:  # transformers' model code is imported only where a model needs it
    from pathlib import Path

    from transformers import PreTrainedModel, PreTrainedTokenizerBase


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
    head: torch.nn.Module | None = None  # a draft head on the target (heads/)
    head_name: str | None = None


def context_limit(model: PreTrainedModel | llamacpp.LlamaCppDraft) -> int | None:
    """The most positions the model takes (None when its config does not say)."""
    if isinstance(model, llamacpp.LlamaCppDraft):
        return model.limit()
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


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model")


def same_tokenizer_files(a: Source, b: Source) -> bool:
    """Whether two cache entries hold byte-identical tokenizer files (their manifests' sha256;
    the chat template aside, which only the target's tokenizer uses)."""
    if a.gguf or b.gguf:
        return False
    ma, mb = cache.read_manifest(a.path), cache.read_manifest(b.path)
    if not (cache.is_current(ma) and cache.is_current(mb)) or "tokenizer.json" not in ma["files"]:
        return False
    return all((ma["files"].get(f) or {}).get("sha256") == (mb["files"].get(f) or {}).get("sha256")
               for f in TOKENIZER_FILES)


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


def _device_map(device: str) -> str | dict[str, str]:
    """A multi-GPU "cuda" spreads the model over every GPU (accelerate); else one device."""
    if device == "cuda":
        return "auto" if torch.cuda.device_count() > 1 else {"": "cuda:0"}
    return {"": device}


def _unpack_gguf(source: Source, spec: ModelSpec, dtype: torch.dtype,
                 progress: Progress | None) -> None:
    """Point a GGUF source at its converted copy in `dtype` (made, or rebuilt, if need be)."""
    if not source.gguf:
        return
    out = cache.converted_dir(source.sha256, dtype_name(dtype))
    problem = problem_of(out)
    if problem is not None:  # else the other role has just made it
        if problem != ABSENT:
            say(progress, f"The cached model in {out} is damaged ({problem}): rebuilding it")
        convert_gguf(source, dtype, spec.trust_remote_code, progress)
    source.path, source.gguf = out, None


def load_model(source: Source, spec: ModelSpec, device: str, dtype: torch.dtype,
               progress: Progress | None = None, role: str = "target", lean: bool = False
               ) -> PreTrainedModel:
    """Load one located model with its dtype, quantization and device, as the "target"
    (which verifies) or the "draft". A CPU scheme's model is mapped packed from the cache
    (quantized and stored there the first time); a GGUF is converted first. `lean`: the model
    only ever runs through specgen's decoders, so where it fits it is built on specgen's
    own tree (loading/mapped.py), without transformers' model code."""
    if spec.quantization == STORED_SCHEME:  # the file's own blocks, mapped: nothing converted
        say(progress, f"Mapping {role} {source.name} as stored in {source.gguf}")
        return stored.load_gguf(source.gguf_path, role)
    if spec.quantization in CPU_SCHEMES:
        if device != "cpu":
            raise ResourceError(
                f"{spec.quantization} uses CPU kernels, but {role}.device is {device}. Load it "
                "on the CPU (--device cpu), or use the bitsandbytes schemes (nf4, fp4, int8) on CUDA.")
        if not source.packed:
            source.path = ensure_packed(source, spec, dtype, progress)
            source.gguf, source.packed = None, True
        say(progress, f"Loading {role} {source.name} in {spec.quantization} on cpu")
        from specgen.loading import packed

        model = packed.load(source.path, dtype, role == "target", spec.trust_remote_code,
                            spec.quantization if lean else None)
        return prepare(model, role, spec.quantization).eval()
    _unpack_gguf(source, spec, dtype, progress)
    fetch_weights(source, progress)
    if spec.quantization in GPU_SCHEMES:  # quantized tensor by tensor, on one GPU
        gpu = torch.device("cuda:0" if device == "cuda" else device)
        cuda_int4.check_device(gpu, dtype)
        say(progress, f"Loading {role} {source.name} in {spec.quantization} on {gpu}")
        config = load_config(source, spec.trust_remote_code)
        from specgen.loading import streamed

        return streamed.load_int4(source.path, config, dtype, gpu, spec.trust_remote_code)
    kwargs = {"dtype": dtype, "trust_remote_code": spec.trust_remote_code,
              "device_map": _device_map(device)}
    if spec.quantization in BNB_SCHEMES:
        kwargs["quantization_config"] = bnb_config(spec.quantization, dtype)
    what = f" in {spec.quantization}" if spec.quantization != "none" else ""
    say(progress, f"Loading {role} {source.name}{what} on {device}")
    if lean:
        config = load_config(source, spec.trust_remote_code, lean)
        if mapped.fits(config, role, dtype, spec.quantization, device, spec.trust_remote_code):
            model = mapped.load(source.path, config, dtype)
            if model is not None:
                model.generation_config = mapped.generation_config(source.path, config)
                return prepare(model, role, "none").eval()
    try:
        model = pretrained(source.path, **kwargs)
    except (OSError, ValueError) as e:
        raise refused_code(source.name, e) or ModelError(f"Cannot load {source.name}: {e}") from None
    return prepare(model, role, "none").eval()


def _weights_key(source: Source, dtype: torch.dtype) -> str:
    """What identifies the target's weights and dtype (tuned skip sets are kept by it): a
    GGUF's sha256, a cache entry's content-keyed name, else the weight files' contents."""
    ident = source.sha256 or (source.path.name if source.packed else None)
    if ident is None:
        try:
            ident = cache.weights_sha256(source.path)
        except ModelError:  # a hub model whose weights are not downloaded yet
            ident = source.repo or source.name
    return hashlib.sha256(f"{ident}|{dtype_name(dtype)}".encode()).hexdigest()[:32]


def load_llama_draft(source: Source, progress: Progress | None = None) -> llamacpp.LlamaCppDraft:
    """The GGUF draft on llama.cpp's CPU kernels, with as many threads as torch uses."""
    say(progress, f"Loading draft {source.name} in llama.cpp on cpu")
    return llamacpp.load_draft(source.path / source.gguf, torch.get_num_threads())


def load_for_training(profile: Profile, progress: Progress | None = None
                      ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """The profile's target as a plain transformers model in its dtype, unquantized and not
    prepared for decoding (teacher forcing reads whole chunks at once), with its tokenizer
    and name: for `specgen heads train`."""
    spec = profile.target
    base = profile.path.parent if profile.path else None
    device = resolve_device(spec.device, "target")
    dtype = resolve_dtype(spec.dtype, device)
    spec = dataclasses.replace(spec, quantization="none")  # trained against the float weights
    source = locate(spec, "target", dtype, progress, base)
    tokenizer = load_tokenizer(source, spec.trust_remote_code)
    config = load_config(source, spec.trust_remote_code)
    if os.environ.get("SPECGEN_SKIP_MEMORY_CHECK") != "1":
        check_memory([(f"target {source.name}", device,
                       estimate_bytes(config, dtype, "none", spec.trust_remote_code))])
    _unpack_gguf(source, spec, dtype, progress)
    fetch_weights(source, progress)
    say(progress, f"Loading target {source.name} on {device}")
    try:
        model = pretrained(
            source.path, dtype=dtype, trust_remote_code=spec.trust_remote_code,
            device_map=_device_map(device))
    except (OSError, ValueError) as e:
        raise refused_code(source.name, e) or ModelError(f"Cannot load {source.name}: {e}") from None
    return model.eval().requires_grad_(False), tokenizer, source.name


def check_head(profile: Profile, target_config, target_name: str,
               progress: Progress | None = None) -> Path:
    """The folder of the profile's draft head, its every tensor checked against the target's
    config from the files' headers: a head of another model is refused before the target's
    weights load."""
    from specgen.heads.layout import check_head as check

    spec = profile.draft
    folder = find_head(spec, profile.name, progress, profile.path.parent if profile.path else None)
    check(folder, spec.kind, target_config.get_text_config(), where=spec.head, target=target_name)
    return folder


def load_head(profile: Profile, folder: Path, target: PreTrainedModel, target_name: str,
              progress: Progress | None = None) -> torch.nn.Module:
    """The profile's draft head from `folder` (check_head's), checked again tensor by tensor
    against the loaded target as it is built."""
    from specgen.heads.layout import KIND_NAMES, load_head as read_head

    spec = profile.draft
    say(progress, f"Loading the {KIND_NAMES[spec.kind]} head {spec.head}")
    return read_head(folder, spec.kind, target.config.get_text_config(), where=spec.head,
                     target=target_name)


def load_pair(profile: Profile, progress: Progress | None = None, peer_draft: bool = False,
              with_head: bool = False, lean: bool = False) -> LoadedPair:
    """Locate, check (tokenizers, memory) and load the profile's target and draft. With
    `peer_draft`, a draft that runs in llama.cpp is also loaded in transformers (as its dtype
    and quantization say), for `specgen bench`'s peer. The profile's draft head is loaded when
    its method drafts with it, or `with_head` (bench contestants). `lean`: the models only run
    through specgen's decoders (never transformers' forward or `generate`), so they may be
    built on specgen's own tree (load_model)."""
    start = time.perf_counter()
    base = profile.path.parent if profile.path else None
    roles = [("target", profile.target)]
    if (profile.draft is not None and profile.draft.has_model
            and profile.speculation.method in MODEL_METHODS):
        roles.append(("draft", profile.draft))
    for role, spec in roles:
        if spec.trust_remote_code:
            warnings.warn(f"{role} {spec.model}: trust_remote_code = true runs Python code from "
                          "the model's repository on this machine.", SpecgenWarning, stacklevel=2)
        if spec.quantization in BNB_SCHEMES:
            bnb_config(spec.quantization, torch.float32)  # fail early if bitsandbytes is missing

    llama = profile.draft is not None and profile.draft.runtime == "llama.cpp"
    if llama and ("draft", profile.draft) in roles and not llamacpp.available():
        raise ConfigError(f"draft.runtime = \"llama.cpp\" needs llama-cpp-python: "
                          f"{llamacpp.INSTALL_HINT}. Or set draft.runtime = \"transformers\".")
    devices, dtypes, sources, tokenizers = {}, {}, {}, {}
    tokenizer_folder = {}  # where each role's tokenizer was read (a GGUF's: its saved copy)
    # Read from the GGUF file itself: a llama.cpp draft, and a model run as stored (on the CPU,
    # float32 around its blocks).
    as_file = {role for role, spec in roles
               if spec.quantization == STORED_SCHEME or llama and role == "draft"}
    for role, spec in roles:
        dev = "cpu" if role in as_file else resolve_device(spec.device, role)
        if role == "draft" and dev == "cuda":
            dev = "cuda:0"  # the draft sits on the first GPU; the target may spread
        devices[role] = dev
        dtypes[role] = torch.float32 if spec.quantization == STORED_SCHEME else resolve_dtype(spec.dtype, dev)
        if spec.quantization in GPU_SCHEMES and not dev.startswith("cuda"):
            raise ResourceError(
                f"{role}.quantization = {spec.quantization!r} runs on a CUDA GPU, and this "
                f"machine has none ({role} device: {dev}). On the CPU use int4-dyn or int4-wo "
                "(--target-quantization int4-dyn).")
        if role in as_file:
            sources[role] = locate_gguf(spec, role, progress, base)
        else:
            sources[role] = locate(spec, role, dtypes[role], progress, base)

    head_folder = None  # a head of another model is refused from the files, before any weights
    if profile.draft is not None and profile.draft.head and (
            with_head or profile.speculation.method in HEAD_KINDS):
        target_config = load_config(sources["target"], profile.target.trust_remote_code, lean)
        head_folder = check_head(profile, target_config, sources["target"].name, progress)
    needs, loads = [], []
    for role, spec in roles:
        if role in as_file:  # mapped from the file as it is
            n = int(sources[role].gguf_path.stat().st_size * OVERHEAD)
            needs.append((f"draft {sources[role].name}", "cpu", n))
            loads.append((n, n))
            continue
        config = load_config(sources[role], spec.trust_remote_code, lean)
        n = estimate_bytes(config, dtypes[role], spec.quantization, spec.trust_remote_code)
        needs.append((f"{role} {sources[role].name}", devices[role], n))
        if spec.quantization in CPU_SCHEMES and not sources[role].packed:  # quantized here first
            loads.append((estimate_bytes(config, dtypes[role], "none", spec.trust_remote_code), n))
        else:
            loads.append((n, n))
    extra = int(loading_peak(loads) - sum(n for _, n in loads))
    if extra > 0:  # quantizing on the CPU (first run only) loads a model whole first
        needs.append(("while quantizing", "cpu", extra))
    if os.environ.get("SPECGEN_SKIP_MEMORY_CHECK") != "1":
        try:
            check_memory(needs)
        except ResourceError as e:
            free = free_bytes(devices["target"])
            raise ResourceError(f"{e} {smaller_profiles(free, profile.name)}") from None

    # llama.cpp loads the draft on a thread of its own (its C calls let go of the GIL) while
    # the tokenizers are read and the target is mapped here.
    draft_load = None
    if llama and "draft" in sources:
        pool = ThreadPoolExecutor(1, thread_name_prefix="specgen-llama-draft")
        draft_load = pool.submit(load_llama_draft, sources["draft"], progress)
        pool.shutdown(wait=False)
    for role, spec in roles:
        if role == "draft" and same_tokenizer_files(sources["target"], sources[role]):
            tokenizers[role] = tokenizers["target"]  # the same files: the same tokenizer
        elif role == "draft" and role in as_file and tokenizer_cache.matched(
                tokenizer_folder["target"], sources[role].gguf_path):
            tokenizers[role] = tokenizers["target"]  # this file matched on an earlier run
        else:
            found = sources[role]
            if spec.quantization == STORED_SCHEME:  # the file's tokenizer, saved once as a folder's
                found = Source(found.name, gguf_tokenizer(found))
            tokenizer_folder[role] = found.path
            tokenizers[role] = load_tokenizer(found, spec.trust_remote_code, lean)
    if "draft" in sources and tokenizers["draft"] is not tokenizers["target"]:
        check_tokenizers(tokenizers["target"], tokenizers["draft"],
                         sources["target"].name, sources["draft"].name)
        if "draft" in as_file:
            tokenizer_cache.remember_match(tokenizer_folder["target"], sources["draft"].gguf_path)

    key = _weights_key(sources["target"], dtypes["target"])  # before loading converts a GGUF
    models = {role: load_model(sources[role], spec, devices[role], dtypes[role], progress, role, lean)
              for role, spec in roles if not (llama and role == "draft")}
    if draft_load is not None:
        models["draft"] = draft_load.result()
    draft_spec = profile.draft if "draft" in models else None
    head = None
    if head_folder is not None:
        head = load_head(profile, head_folder, models["target"], sources["target"].name, progress)
    peer = None
    if peer_draft and llama and draft_spec is not None:  # transformers' copy of the same draft
        source = locate(draft_spec, "draft", dtypes["draft"], progress, base)
        peer = load_model(source, draft_spec, "cpu", dtypes["draft"], progress, "draft")
    return LoadedPair(
        target=models["target"], draft=models.get("draft"), tokenizer=tokenizers["target"],
        peer_draft=peer,
        target_name=sources["target"].name,
        draft_name=sources["draft"].name if "draft" in sources else (
            profile.draft.head if head is not None else None),  # who drafts
        device=devices["target"], dtype=dtype_name(dtypes["target"]),
        quantization=profile.target.quantization,
        draft_quantization=draft_spec.quantization if draft_spec else "none",
        head=head, head_name=profile.draft.head if head is not None else None,
        load_seconds=time.perf_counter() - start, target_key=key,
    )
