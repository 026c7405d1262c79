"""Memory estimates: what loading a profile will take, checked before anything loads, and
rough figures from names alone for listings. torch is imported only where a config is counted."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from specgen.choices import CPU_SCHEMES, MODEL_METHODS, QUANT_BYTES
from specgen.errors import ResourceError
from specgen.profiles import ModelSpec, Profile, list_profiles, load_profile

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

    from specgen.loading.plan import PairPlan


OVERHEAD = 1.1  # activations, KV cache for a few thousand tokens, allocator slack


def estimate_bytes(config: PretrainedConfig, dtype: torch.dtype, quantization: str,
                   trust_remote_code: bool = False) -> int:
    """Bytes the loaded model will take: its parameters (counted on the meta device, so
    nothing is allocated) at the dtype's size, quantized linear layers (bitsandbytes keeps
    the output head; specgen's CPU schemes quantize it too) at the scheme's size, plus a
    margin."""
    import torch

    from specgen.models import config as config_values, llama

    if config_values.builds(config) and not trust_remote_code:  # the same parameters, no model code
        model = llama.CausalLM(config)
    else:
        from transformers import AutoModelForCausalLM

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
    import torch

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
            parts = " + ".join(f"{label} {gb(n)}" for label, n in items)
            raise ResourceError(
                f"Not enough memory on {dev}: loading needs about {gb(need)} ({parts}) but "
                f"{gb(free)} is free. {suggestion}".strip())


def check_pair(plan: PairPlan) -> None:
    """Refuse a pair that does not fit, with a smaller profile that would (a CPU scheme's
    first run loads the model whole before quantizing it)."""
    from specgen.loading.plan import FROM_THE_FILE  # torch: only where a pair loads
    from specgen.loading.sources import load_config

    needs, loads = [], []
    for role in (plan.target, plan.draft):
        if role is None:
            continue
        if role.runtime in FROM_THE_FILE:  # mapped from the file as it is
            n = int(role.files.gguf_path.stat().st_size * OVERHEAD)
            needs.append((f"{role.role} {role.files.name}", "cpu", n))
            loads.append((n, n))
            continue
        spec = role.spec
        config = load_config(role.files, spec.trust_remote_code, plan.lean)
        n = estimate_bytes(config, role.dtype, spec.quantization, spec.trust_remote_code)
        needs.append((f"{role.role} {role.files.name}", role.device, n))
        whole = n
        if role.build is not None and role.build.kind == "quantized":  # quantized here first
            whole = estimate_bytes(config, role.dtype, "none", spec.trust_remote_code)
        loads.append((whole, n))
    extra = int(loading_peak(loads) - sum(n for _, n in loads))
    if extra > 0:  # quantizing on the CPU (first run only) loads a model whole first
        needs.append(("while quantizing", "cpu", extra))
    if os.environ.get("SPECGEN_SKIP_MEMORY_CHECK") == "1":
        return
    try:
        check_memory(needs)
    except ResourceError as e:
        free = free_bytes(plan.target.device)
        raise ResourceError(f"{e} {smaller_profiles(free, plan.profile)}") from None


def gb(n: float) -> str:
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
    parts = [rough_bytes(s) for s in (profile.target, profile.draft) if s is not None and s.has_model]
    if profile.speculation.method not in MODEL_METHODS:
        parts = parts[:1]
    return None if None in parts else loading_peak(parts)


def smaller_profiles(free: float, current: str) -> str:
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
