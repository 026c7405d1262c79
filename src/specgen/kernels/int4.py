"""specgen's own int4 kernel for x86 CPUs (`int4-dyn`): int4 weights, int8 activations.

PyTorch's CPU int4 kernel converts every weight to floating point before multiplying; fbgemm's
integer GEMM is int8 only. `int4.c` multiplies int4 weights by int8 activations with integer
dot products per block of 32 inputs (as llama.cpp's Q4_1 x Q8_1 does), reading 0.625 bytes a
weight. Its cost grows with the tokens of a pass (each token's integer products, and a float
pass per 16 blocks), so a verify pass costs more than a one-token pass: the adaptive policy
measures that cost rather than assuming it (docs/cpu-kernels.md has the figures).

Row by row, two paths: AVX2 everywhere it builds, and AVX512-VNNI, which gives AVX2's bits four
blocks at a time (and unpacks each weight block once for up to 4 tokens). Passes wider than
any verify pass (a prompt) take tile products of 16 rows by 16 tokens, whose sums are added in
another order: by AMX tiles where the CPU has them, else by AVX512-VNNI registers
(VNNI_TILES), with the AMX path's bits. A verify pass is never that wide (choices.MAX_K), so
each of its tokens gets the bits of a one-token pass. A draft's layers need no such bits and
take the tiles from DRAFT_TILE_ROWS tokens on (its catch-ups).
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from specgen.errors import ResourceError
from specgen.kernels import build
from specgen.kernels.build import C, I, P
from specgen.kernels.linear import FP32_ROWS

BLOCK = 32  # inputs per 4-bit grid, and per activation scale

STEM = "int4"


FUNCTIONS = {
    "int4_linear": C((P, P, P, P, P, P, I, I, I, P, P, P, I, I)),
    "int4_path": C((), I),
}


def check_cpu() -> None:
    """int4-dyn needs AVX2 and FMA (x86 CPUs from about 2013 on)."""
    if not build.has_avx2():
        raise ResourceError(
            f"int4-dyn needs an x86 CPU with AVX2; this one offers "
            f"{torch.backends.cpu.get_cpu_capability()}. Use int8-wo or int4-wo instead.")


def library() -> ctypes.CDLL:
    """The compiled kernel, loaded once per process; int4-dyn has no PyTorch fallback, so a
    CPU without AVX2 or a missing compiler is a ResourceError that names the alternatives."""
    if not build.loaded(STEM):  # every layer of every pass asks
        check_cpu()
    return build.load(STEM, "the int4-dyn kernel", FUNCTIONS, instead="int8-dyn")


AVX2, VNNI, AMX, VNNI_TILES = 0, 1, 2, 3  # the kernel's paths (int4.c)
WIDE_ROWS = FP32_ROWS  # passes up to this many rows go row by row; wider ones (a prompt) to tiles
# A draft's rows need no one-token bits (what a draft computes is what q is), so its passes take
# the tiles from this width on: one tile covers 16 tokens for about the price of a few rows, and
# a draft's catch-ups (a short prompt, the tokens lookup drafted) are this wide.
DRAFT_TILE_ROWS = 16


@functools.cache
def best_path() -> int:
    """The fastest path this CPU runs: AMX-INT8 tiles (for wide passes), AVX512-VNNI
    `vpdpbusd`, or AVX2. Also where Linux is asked, once, to let this process use AMX tiles."""
    path = library().int4_path()  # asks for the tiles, whatever it returns
    return AVX2 if build.avx2_only() else path


def paths() -> tuple[int, ...]:
    """Every path this CPU runs."""
    best = best_path()
    return (AVX2,) + ((VNNI, VNNI_TILES) if best >= VNNI else ()) + ((AMX,) if best == AMX else ())


def path_for(rows: int, exact: bool = True) -> int:
    """The path a pass over `rows` tokens takes. AVX2 and VNNI give the same bits, and each
    row's whatever the pass's width; the tile paths add a row's sums in another order, so an
    `exact` layer's (a target's) take only passes wider than a verify pass can be
    (choices.MAX_K): a prompt's. A draft's (not `exact`) take them from DRAFT_TILE_ROWS."""
    best = best_path()
    if rows < (WIDE_ROWS + 1 if exact else DRAFT_TILE_ROWS):
        return min(best, VNNI)
    return {AMX: AMX, VNNI: VNNI_TILES}.get(best, AVX2)


def quad_bytes(k: int) -> int:
    """Bytes of one token's int8 activations as the row-by-row paths read them: quads of 4
    blocks, a last partial quad padded (int4.c, QUAD_BYTES)."""
    return -(-k // (4 * BLOCK)) * 4 * BLOCK


# --- the format (pure tensor functions) ---------------------------------------------------

def quantize(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [N, K] (K a multiple of 32) ~= dequantize(packed, scales): per block of 32 inputs
    w = d q + m with q in 0..15 spanning the block from its minimum m to its maximum (a GGUF
    Q4_K weight is such a grid per block of 32 already, so it comes back nearly as it was).
    Returns (packed uint8 [N, K/32, 16], scales float16 [2, N, K/32]: d, then m); byte j of
    a block holds q[j] in its low nibble and q[j + 16] in its high one. q is rounded against
    the fp16 d and m, so that dequantizing gives the nearest point of the stored grid."""
    n, k = w.shape
    blocks = w.float().reshape(n, k // BLOCK, BLOCK)
    low = blocks.amin(2).half().float()
    d = ((blocks.amax(2) - low) / 15).half().float()
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = ((blocks - low[..., None]) * inverse[..., None]).round().clamp(0, 15).to(torch.uint8)
    scales = torch.stack([d, low]).half().contiguous()
    return (q[..., :16] | (q[..., 16:] << 4)).contiguous(), scales


def dequantize(packed: Tensor, scales: Tensor) -> Tensor:
    q = torch.cat([packed & 15, packed >> 4], -1).float()
    d, m = scales.float()
    return (q * d[..., None] + m[..., None]).reshape(packed.shape[0], -1)


def linear(x: Tensor, packed: Tensor, scales: Tensor, bias: Tensor | None,
           path: int | None = None, exact: bool = True) -> Tensor:
    """x [M, K] float32 @ W.T (+ bias float32 [N]) -> [M, N] float32, W given by `quantize`,
    on `path_for(M, exact)` unless `path` names another the CPU has (tests and benches compare
    them).
    Called some 200 times a decoding step: pointers into whole buffers, no tensor views."""
    lib = library()
    build.check_path(path, paths(), "int4-dyn")
    m, k = x.shape
    n = packed.shape[0]
    y = torch.empty(m, n)
    x = x.contiguous()
    qx = torch.empty(m * quad_bytes(k), dtype=torch.int8)  # each token's, padded to quads
    ex = torch.empty(2 * m * (k // BLOCK))  # the scales, then each scale times its block's sum
    scales = scales.contiguous()  # d [N, K/32], then m
    lib.int4_linear(x.data_ptr(), packed.data_ptr(), scales.data_ptr(),
                    scales.data_ptr() + scales.nbytes // 2, None if bias is None else bias.data_ptr(),
                    y.data_ptr(), m, k, n, qx.data_ptr(), ex.data_ptr(), ex.data_ptr() + ex.nbytes // 2,
                    path_for(m, exact) if path is None else path, torch.get_num_threads())
    return y
