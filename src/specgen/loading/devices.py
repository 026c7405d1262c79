"""Where a model runs and in which floating-point type: "auto" resolved for this machine.
torch is imported only where a device or dtype is resolved (the cache's listings need
`cpu_has_bf16` without it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from specgen.errors import ResourceError

if TYPE_CHECKING:
    import torch


def resolve_device(device: str, role: str = "target") -> str:
    """"auto" is CUDA when present, else CPU; asking for CUDA without it is refused."""
    import torch

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
    bytes pays even without native bf16 instructions (AVX2 widens them in registers). Older
    x86 and unknown CPUs get fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16|avx512f|avx2|bf16)\b", flags))


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """"auto": bf16 where it is fast (CUDA with bf16, AVX2/AVX-512/Arm-bf16 CPUs), else fp16
    on GPU and fp32 on CPU."""
    import torch

    if dtype != "auto":
        return getattr(torch, dtype)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_bf16() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
