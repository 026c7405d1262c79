"""specgen's own int8 kernel for x86 CPUs (`int8-dyn`): int8 weights, 7-bit activations.

It computes what PyTorch's fbgemm dynamic linear computed for int8-dyn, bit for bit
(int8.c says how), from the int8 weights and bf16 scales as stored: fbgemm needs each
weight repacked into its own layout at every load (most of an int8-dyn model's start),
where this kernel reads a cached model's weights as they are mapped from the file.

Two paths, the same bits (integer sums are exact in any order): AVX2 (`vpmaddubsw`) and
AVX512-VNNI (`vpdpbusd`), each over blocks of up to 4 tokens by 4 (VNNI) or 2 (AVX2) outputs.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from specgen.kernels import build
from specgen.kernels.build import C, I, P

STEM = "int8"
AVX2, VNNI = 0, 1  # the kernel's paths (int8.c)
CHUNK = 64  # activation rows are padded to a multiple of this many bytes


FUNCTIONS = {
    "int8_linear": C((P, P, P, P, I, I, I, P, P, I, I, I)),
    "int8_path": C((), I),
}


def library() -> ctypes.CDLL | None:
    """The compiled kernel, loaded once per process; None where it cannot be built (no AVX2,
    no C compiler): int8-dyn then packs its weights for fbgemm, as it did before (slower to
    load, the same bits)."""
    return build.load(STEM, "the int8-dyn kernel", FUNCTIONS)


@functools.cache
def best_path() -> int:
    return AVX2 if build.avx2_only() else library().int8_path()


def paths() -> tuple[int, ...]:
    """Every path this CPU runs."""
    return (AVX2, VNNI) if best_path() == VNNI else (AVX2,)


def linear(x: Tensor, weight: Tensor, scales: Tensor, exact: bool, path: int | None = None) -> Tensor:
    """x [M, K] float32 @ W.T -> [M, N] float32, W = weight (int8 [N, K]) times scales (bf16
    [N]) per row; `exact`: each row alone (a target's layer), else one activation scale for the
    call, as fbgemm chose it (a draft's). On the fastest path unless `path` names another.
    Called some 200 times a decoding step: pointers into whole buffers, no tensor views."""
    lib = library()
    build.check_path(path, paths(), "int8-dyn")
    m, k = x.shape
    x = x.contiguous()
    n = weight.shape[0]
    y = torch.empty(m, n)
    qx = torch.empty(m * (-(-k // CHUNK) * CHUNK), dtype=torch.uint8)
    amax = torch.empty(m)
    lib.int8_linear(x.data_ptr(), weight.data_ptr(), scales.data_ptr(), y.data_ptr(), m, k, n,
                    qx.data_ptr(), amax.data_ptr(), int(exact),
                    best_path() if path is None else path, torch.get_num_threads())
    return y
