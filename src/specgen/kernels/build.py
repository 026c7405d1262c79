"""specgen's C kernels (int4.c, linear.c, rows.c): compiled once with the system's C compiler
into the cache, keyed by their source, the header they share and the flags, and loaded
through ctypes, which lets go of the GIL while they run. Their OpenMP runtime is the one
PyTorch loaded (same soname).

Each kernel module states its library's C functions as values (`C`); `load` is the one way
it gets the library, declared by them; `swapped` is the one hook that puts another build in
its place (an A/B run against another revision's source, or PyTorch's ops with None)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from specgen.errors import ResourceError
from specgen.paths import cache_dir

HERE = Path(__file__).parent
# No fused multiply-add but where the code asks for one: a product and a sum are rounded as
# written, as PyTorch's elementwise ops round them (rows.c's rotary embedding).
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
# How, not what: with link-time optimisation gcc optimises a unit's functions in parallel jobs
# (make runs them; gcc counts the CPUs), where most of gguf.c's compile goes. Without make gcc
# runs those jobs one by one, slower than not splitting at all, so then, or where a compiler
# refuses the flag, a kernel compiles the plain way. Either way its arithmetic is what the
# source (intrinsics) and FLAGS fix, so its bits do not depend on which way it was compiled.
PARALLEL = ("-flto=auto",)

_loaded: dict[str, ctypes.CDLL | None] = {}

# The C types the kernels' functions take and return.
P, I, I64, FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float


@dataclass(frozen=True)
class C:
    """A C function's signature, as its .c file declares it: argument types, result type
    (None: void)."""

    args: tuple = ()
    returns: type | None = None


Functions = Mapping[str, C]  # a library's C functions by name


def declare(lib: ctypes.CDLL, functions: Functions) -> ctypes.CDLL:
    for name, sig in functions.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = list(sig.args), sig.returns
    return lib


def check_path(path: int | None, have: tuple[int, ...], kernel: str) -> None:
    """A path a caller names (tests and benches compare them; None: the kernel picks) must be
    one this CPU runs."""
    if path is not None and path not in have:
        raise ValueError(f"this CPU has no {kernel} path {path} (it has {have})")


# Set (to anything but 0): every kernel takes its AVX2 path, as on a CPU without AVX-512 or
# AMX, so that one machine shows what an AVX2-only one would run (the same bits: each path
# gives its own, and the paths' tests hold them to the contract).
AVX2_ONLY = "SPECGEN_AVX2_ONLY"


def avx2_only() -> bool:
    return os.environ.get(AVX2_ONLY, "") not in ("", "0")


def has_avx2() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def compiler(what: str, instead: str) -> str:
    found = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not found:
        raise ResourceError(
            f"{what} compiles a small C kernel once and needs a C compiler with OpenMP "
            f"(gcc): install it (Debian/Ubuntu: apt install gcc), or use {instead} instead.")
    return found


def compile_file(source: Path, out: Path, what: str = "a kernel", instead: str = "PyTorch's"
                 ) -> None:
    """`source` (with the headers beside it) compiled with FLAGS into the library `out`, in
    parallel where the compiler and make can (PARALLEL)."""
    cc = compiler(what, instead)
    # A parent make's job slots are not passed down: gcc takes the CPUs it counts.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    for flags in ((FLAGS + PARALLEL, FLAGS) if shutil.which("make") else (FLAGS,)):
        done = subprocess.run([cc, *flags, str(source), "-o", str(out)], capture_output=True,
                              text=True, env=env)
        if not done.returncode:
            return
    raise ResourceError(f"Compiling {what} failed:\n{done.stderr.strip()}\n"
                        f"Use {instead} instead, or report this with the message above.")


def library_path(source: Path) -> Path:
    """Where `source`'s library is cached: keyed by the source, the headers beside it and the
    flags."""
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    flags = " ".join(FLAGS + PARALLEL).encode()
    digest = hashlib.sha256(source.read_bytes() + headers + flags).hexdigest()[:16]
    return cache_dir() / "kernels" / f"{source.stem}-{digest}.so"


def build(source: Path, what: str, instead: str) -> ctypes.CDLL:
    """`source` compiled into specgen's cache on first use (atomically: a crash never leaves
    half a library) and loaded. `what` and `instead` name it and its alternative in errors."""
    path = library_path(source)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            compile_file(source, tmp, what, instead)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return ctypes.CDLL(str(path))


def load(stem: str, what: str, functions: Functions, instead: str | None = None
         ) -> ctypes.CDLL | None:
    """The kernel `stem`.c, built and loaded once per process, its `functions` declared.
    Where it cannot be built (no AVX2, no compiler, a failed compile) this is None for
    kernels whose callers keep PyTorch's ops; a kernel with no such fallback names its
    alternative in `instead`, and the failure is raised as a ResourceError that says so."""
    if stem not in _loaded:
        lib = None
        try:
            if not has_avx2():
                raise ResourceError(
                    f"{what} needs an x86 CPU with AVX2; this one offers "
                    f"{torch.backends.cpu.get_cpu_capability()}. Use {instead} instead.")
            lib = declare(build(HERE / f"{stem}.c", what, instead or "PyTorch's"), functions)
        except ResourceError:
            if instead is not None:
                raise
        _loaded[stem] = lib
    return _loaded[stem]


def loaded(stem: str) -> bool:
    """Whether the kernel `stem` is loaded in this process (a caller's own checks before the
    first load need not run again on every call)."""
    return _loaded.get(stem) is not None


def compiled(stem: str) -> bool:
    """Whether loading the kernel `stem` compiles nothing: it is loaded, or in the cache."""
    return loaded(stem) or library_path(HERE / f"{stem}.c").exists()


@contextmanager
def swapped(stem: str, lib: ctypes.CDLL | None, functions: Functions) -> Iterator[None]:
    """Within the block, kernel `stem` is `lib` (its `functions` declared), or PyTorch's
    ops where lib is None: for A/B runs, never for generation."""
    had, old = stem in _loaded, _loaded.get(stem)
    if lib is not None:
        declare(lib, functions)
    _loaded[stem] = lib
    try:
        yield
    finally:
        if had:
            _loaded[stem] = old
        else:
            _loaded.pop(stem, None)
