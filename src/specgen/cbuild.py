"""specgen's C kernels (cpu_int4.c, cpu_linear.c, cpu_rows.c): compiled once with the system's C
compiler into the cache, keyed by their source, the header they share and the flags, and
loaded through ctypes, which lets go of the GIL while they run. Their OpenMP runtime is the
one PyTorch loaded (same soname)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch

from specgen.errors import ResourceError

# No fused multiply-add but where the code asks for one: a product and a sum are rounded as
# written, as PyTorch's elementwise ops round them (cpu_rows.c's rotary embedding).
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")


def has_avx2() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def compiler(what: str, instead: str) -> str:
    found = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not found:
        raise ResourceError(
            f"{what} compiles a small C kernel once and needs a C compiler with OpenMP "
            f"(gcc): install it (Debian/Ubuntu: apt install gcc), or use {instead} instead.")
    return found


def build(source: Path, what: str, instead: str) -> ctypes.CDLL:
    """`source` compiled into specgen's cache on first use (atomically: a crash never leaves
    half a library) and loaded. `what` and `instead` name it and its alternative in errors."""
    from specgen.models import cache_dir

    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))  # amx_tiles.h
    digest = hashlib.sha256(source.read_bytes() + headers + " ".join(FLAGS).encode()).hexdigest()[:16]
    path = cache_dir() / "kernels" / f"{source.stem}-{digest}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        done = subprocess.run([compiler(what, instead), *FLAGS, str(source), "-o", str(tmp)],
                              capture_output=True, text=True)
        if done.returncode:
            raise ResourceError(f"Compiling {what} failed:\n{done.stderr.strip()}\n"
                                f"Use {instead} instead, or report this with the message above.")
        os.replace(tmp, path)
    return ctypes.CDLL(str(path))


def build_if_possible(source: Path, what: str) -> ctypes.CDLL | None:
    """`build`, or None where it cannot be done (no AVX2, no compiler, a failed compile): for
    kernels whose callers keep PyTorch's ops instead."""
    if not has_avx2():
        return None
    try:
        return build(source, what, "PyTorch's")
    except ResourceError:
        return None
