"""What this machine's CPU computes fast, read without torch: the plan's "auto" dtype on the
CPU (plan.resolve_dtype) and the cache listing's guess of it (cache_listing.py, which never
imports torch)."""

from __future__ import annotations

import re
from pathlib import Path


def cpu_has_bf16() -> bool:
    """Whether bf16 beats fp32 on this CPU. Decoding is bound by memory bandwidth, so half the
    bytes pays even without native bf16 instructions (AVX2 widens them in registers). Older
    x86 and unknown CPUs get fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16|avx512f|avx2|bf16)\b", flags))
