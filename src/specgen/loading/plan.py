"""Each role of a profile (the target, the draft) resolved once, before any weight loads,
into a `RolePlan`: the runtime that will run it, its device and dtype, the files read
before the weights (config, tokenizer, the memory estimate) and the cache entry to build
first, if any. A `PairPlan` holds the roles and the draft head's checked folder; load.py
carries a plan out.

The runtimes: "stored" (a GGUF's blocks mapped, loading/stored.py), "llama.cpp" (a GGUF
draft on llama.cpp), "packed" (a CPU scheme's packed entry, loading/mapped.py), "int4-gpu"
(quantized tensor by tensor onto a GPU, loading/streamed.py), "transformers" (everything
else: float, bitsandbytes, a GGUF's converted copy)."""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from specgen.choices import (BNB_SCHEMES, CPU_SCHEMES, GPU_SCHEMES, HEAD_KINDS, MODEL_METHODS,
                             STORED_SCHEME)
from specgen.decoding import llamacpp
from specgen.errors import ConfigError, ModelError, ResourceError, SpecgenWarning
from specgen.loading import cache, devices
from specgen.loading.sources import (ModelFiles, Progress, find_checked, find_head, is_gguf,
                                     load_config)
from specgen.profiles import ModelSpec, Profile

FROM_THE_FILE = ("stored", "llama.cpp")  # runtimes that read the GGUF file itself


@dataclass(frozen=True)
class Build:
    """A cache entry to make before the weights load (convert.py names and builds it):
    `kind` "converted" (a GGUF dequantised) or "quantized" (packed for a CPU scheme), from
    `origin` (the model's files, or for a packed GGUF its converted copy where one is
    cached)."""

    kind: str
    origin: ModelFiles


@dataclass(frozen=True)
class RolePlan:
    role: str  # "target" (verifies) or "draft"
    spec: ModelSpec
    runtime: str  # see the module's docstring
    device: str
    dtype: torch.dtype
    files: ModelFiles  # what is read before the weights: the model's own files, or its entry
    build: Build | None = None  # the entry to make first (then the weights are read from it)


@dataclass(frozen=True)
class HeadPlan:
    """A draft head on the target (heads/): its folder, checked against the target's config."""

    folder: Path
    name: str  # as the profile gives it (draft.head)
    kind: str  # choices.HEAD_KINDS


@dataclass(frozen=True)
class PairPlan:
    profile: str  # its name (a refusal for memory suggests a smaller one)
    target: RolePlan
    draft: RolePlan | None  # where the profile's method drafts with a draft model
    target_key: str  # the target's weights and dtype (what tuned skip sets are kept by)
    head: HeadPlan | None = None
    lean: bool = False  # the models only run through specgen's decoders (load.py)


def runtime_of(role: str, spec: ModelSpec) -> str:
    """What will run the role's model (see the module's docstring)."""
    if role == "draft" and spec.runtime == "llama.cpp":
        return "llama.cpp"
    if spec.quantization == STORED_SCHEME:
        return "stored"
    if spec.quantization in CPU_SCHEMES:
        return "packed"
    if spec.quantization in GPU_SCHEMES:
        return "int4-gpu"
    return "transformers"


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


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """"auto": bf16 where it is fast (CUDA with bf16, AVX2/AVX-512/Arm-bf16 CPUs), else fp16
    on GPU and fp32 on CPU."""
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if devices.cpu_has_bf16() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resolve_role(role: str, spec: ModelSpec, progress: Progress | None = None,
                 base: Path | None = None) -> RolePlan:
    """One role's plan: its runtime, device and dtype checked against each other, its files
    found (a GGUF's sha256 checked), and its intact cache entry, or the one to build."""
    runtime = runtime_of(role, spec)
    if runtime in FROM_THE_FILE:  # on the CPU
        device = "cpu"
    else:
        device = resolve_device(spec.device, role)
        if role == "draft" and device == "cuda":
            device = "cuda:0"  # the draft sits on the first GPU; the target may spread
    dtype = torch.float32 if runtime == "stored" else resolve_dtype(spec.dtype, device)
    if runtime == "int4-gpu" and not device.startswith("cuda"):
        raise ResourceError(
            f"{role}.quantization = {spec.quantization!r} runs on a CUDA GPU, and this "
            f"machine has none ({role} device: {device}). On the CPU use int4-dyn or int4-wo "
            "(--target-quantization int4-dyn).")
    if runtime == "packed" and device != "cpu":
        raise ResourceError(
            f"{spec.quantization} uses CPU kernels, but {role}.device is {device}. Load it "
            "on the CPU (--device cpu), or use the bitsandbytes schemes (nf4, fp4, int8) on CUDA.")
    if runtime in FROM_THE_FILE:
        files, build = find_checked(spec, role, progress, base), None
    else:
        files, build = _locate(spec, role, dtype_name(dtype), progress, base)
    return RolePlan(role, spec, runtime, device, dtype, files, build)


def _locate(spec: ModelSpec, role: str, dtype: str, progress: Progress | None,
            base: Path | None) -> tuple[ModelFiles, Build | None]:
    """A model entry's files: its intact cache entry (a packed model for a CPU scheme, else a
    GGUF's converted copy; found by the declared sha256, so neither hub nor demo packages
    are needed), else the model's own files and the entry to build from them. A damaged
    entry is rebuilt when the model's source can be found, and refused with one line naming
    its folder when not."""
    scheme = spec.quantization if spec.quantization in CPU_SCHEMES else None
    declared = None
    if is_gguf(spec) and spec.sha256:
        declared = cache.lookup(spec.sha256, dtype, scheme)
        if declared.ready:
            return ModelFiles(spec.model, declared.path, sha256=spec.sha256, verified=True), None
    try:
        found = find_checked(spec, role, progress, base)
    except ModelError as e:
        if declared is None or not declared.damaged:
            raise
        raise cache.DamagedCache(
            f"The cached model in {declared.path} is damaged ({declared.problem}) and its source "
            f"cannot be found to rebuild it ({e}) Delete that folder and make the source "
            "available again.") from None
    if found.gguf:
        entry = cache.lookup(found.sha256, dtype, scheme)
        if entry.ready:
            return ModelFiles(found.name, entry.path, sha256=found.sha256, verified=True), None
        origin = found
        converted = cache.lookup(found.sha256, dtype, None) if scheme else None
        if converted is not None and converted.ready:  # packed from the float copy
            origin = ModelFiles(found.name, converted.path, sha256=found.sha256, verified=True)
        return found, Build("quantized" if scheme else "converted", origin)
    if scheme is None:
        return found, None
    if found.repo is None:  # a local folder: its weights are here to hash (a hub's: later)
        entry = cache.lookup(cache.weights_sha256(found.path), dtype, scheme)
        if entry.ready:
            return ModelFiles(found.name, entry.path), None
    return found, Build("quantized", found)


def plan_pair(profile: Profile, progress: Progress | None = None, lean: bool = False) -> PairPlan:
    """The profile's target, and its draft model where its method drafts with one, each
    resolved once; the draft head where the method drafts with it, checked against the
    target's config before any weights load. `lean`: see load.load_pair."""
    base = profile.path.parent if profile.path else None
    specs = [("target", profile.target)]
    if (profile.draft is not None and profile.draft.model  # a draft model, not a head alone
            and profile.speculation.method in MODEL_METHODS):
        specs.append(("draft", profile.draft))
    for role, spec in specs:
        _check_available(role, spec)
    roles = [resolve_role(role, spec, progress, base) for role, spec in specs]
    plan = PairPlan(profile.name, roles[0], roles[1] if len(roles) > 1 else None,
                    weights_key(roles[0]), lean=lean)
    if profile.speculation.method in HEAD_KINDS and profile.draft is not None and profile.draft.head:
        plan = with_head(plan, profile, progress)
    return plan


def weights_key(plan: RolePlan) -> str:
    """What identifies a role's weights and dtype: a GGUF's sha256, a packed entry's
    content-keyed name, else the weight files' contents."""
    files = plan.files
    ident = files.sha256
    if ident is None and plan.runtime == "packed" and plan.build is None:
        ident = files.path.name
    if ident is None:
        try:
            ident = cache.weights_sha256(files.path)
        except ModelError:  # a hub model whose weights are not downloaded yet
            ident = files.repo or files.name
    return hashlib.sha256(f"{ident}|{dtype_name(plan.dtype)}".encode()).hexdigest()[:32]


def _check_available(role: str, spec: ModelSpec) -> None:
    """Warn of remote code, and refuse a runtime whose package is missing, before anything
    is found or downloaded."""
    if spec.trust_remote_code:
        warnings.warn(f"{role} {spec.model}: trust_remote_code = true runs Python code from "
                      "the model's repository on this machine.", SpecgenWarning, stacklevel=4)
    if spec.quantization in BNB_SCHEMES:
        bnb_config(spec.quantization, torch.float32)  # fail early if bitsandbytes is missing
    if runtime_of(role, spec) == "llama.cpp" and not llamacpp.available():
        raise ConfigError(f"draft.runtime = \"llama.cpp\" needs llama-cpp-python: "
                          f"{llamacpp.INSTALL_HINT}. Or set draft.runtime = \"transformers\".")


def with_head(plan: PairPlan, profile: Profile, progress: Progress | None = None) -> PairPlan:
    """The plan with the profile's draft head (a folder, checked tensor by tensor against the
    target's config from the files' headers: a head of another model is refused before the
    target's weights load)."""
    from specgen.heads.layout import check_head

    spec = profile.draft
    if plan.head is not None or spec is None or not spec.head:
        return plan
    target = plan.target
    config = load_config(target.files, target.spec.trust_remote_code, plan.lean)
    folder = find_head(spec, profile.name, progress, profile.path.parent if profile.path else None)
    check_head(folder, spec.kind, config.get_text_config(), where=spec.head, target=target.files.name)
    return dataclasses.replace(plan, head=HeadPlan(folder, spec.head, spec.kind))


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
