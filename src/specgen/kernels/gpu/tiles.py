"""The Triton kernels behind kernels/gpu (imported only where Triton is).

The rule every kernel keeps: a row's result does not depend on how many rows the call has.
Rows go in tiles of BLOCK_M = 16 (a tile's unused rows are zeros), every reduction runs in one
order fixed by the operands' shapes (never by the number of rows), and accumulation is fp32.
A linear splits its inputs (K) into a number of parts fixed by N, K and the SM count, never by
M, and adds the parts in one order (`splits`, `_finish`); attention walks the cache
in blocks fixed by slot index, so the blocks a wider pass adds past a row's own position are
wholly masked for that row and change none of its bits (exp(-inf) = 0, a factor exp(0) = 1).

The number of rows M is never specialized (`do_not_specialize=["M"]`): left to itself Triton
compiles a kernel again for M = 1 (a constant) and for M divisible by 16 (an alignment hint),
so a pass of 1, 16 or 32 rows would run another binary than one of 2 or 17, with its own
instruction order. One binary per kernel serves every width (tests/test_gpu_kernels.py
checks its hash for M = 1..33, compiled for sm_90).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_M = 16  # rows per tile: tl.dot's smallest, and the widest one-tile pass
BLOCK_K = 128  # inputs per step of a linear; an int4 step is one quantization group
GROUP = 128
CHUNK = 256  # cache slots per attention program (flash-decoding's split, fixed by slot)
BLOCK_KV = 64  # cache slots per attention step
BLOCK_C = 16  # chunks merged per step


ROW_TILES = 3  # row tiles a linear's program loops over: 48 rows, every graph width (<= 33)
INT4_WARPS = 8  # an int4 program's warps: 128 weights of a group a thread (block_n)
HOPPER_SMS = 132  # H100 and H200 (SXM): the SM count the offline sm_90 measurement assumes
INTERPRETER_SMS = 2  # what a CPU under Triton's interpreter counts: tiny tests still split K


def block_n(n: int, device: torch.device, int4: bool = False) -> int:
    """Outputs per linear program, fixed by N alone (never by M). On a GPU an int4 tile is
    256 outputs over INT4_WARPS warps (the costs of its inputs' tile, the RMSNorm's among
    them, spread over more weights a thread: docs/gpu-kernels.md), a dense one 16 to 64;
    K is split to give enough programs (`splits`). On a CPU (Triton's interpreter runs
    programs one by one) 64, for few programs."""
    if device.type == "cpu":
        return 64
    if int4:
        return 256
    return 16 if n <= 8192 else 32 if n <= 32768 else 64


def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return HOPPER_SMS if device.type == "meta" else INTERPRETER_SMS


def splits(n: int, k: int, bn: int, bk: int, sms: int) -> int:
    """How many parts a linear's K is cut into: from N, K and the SM count only, never from M,
    so a row's partial sums, and their order, are the same in a pass of any width. Enough
    parts for two programs per SM (one pass of a few rows is a stream of the weights: every
    SM must pull), at most one per K step."""
    tiles, steps = triton.cdiv(n, bn), triton.cdiv(k, bk)
    return max(1, min(steps, triton.cdiv(2 * sms, tiles)))


_counters: dict[torch.device, Tensor] = {}
_kept: list[Tensor] = []  # outgrown count buffers: a captured graph may still point at one
CHUNK_ROWS = 1536  # a wider call runs in calls of this many rows (a multiple of 48): the
# partial sums' buffer stays small, and a row's bits do not depend on the chunking


def counters(device: torch.device, size: int) -> Tensor:
    """Zeros, one per output tile, for split-K's arrivals: each launch leaves them zero (its
    last program resets its tile's), so one buffer per device serves every linear in stream
    order, and a CUDA graph's replays too (made before capture: FusedDecoder asks first)."""
    have = _counters.get(device)
    if have is None or have.numel() < size:
        if have is not None:
            _kept.append(have)
        have = torch.zeros(max(size, 1 << 14), dtype=torch.int32, device=device)
        _counters[device] = have
    return have


_exponents: dict[torch.device, Tensor] = {}


def exponents(device: torch.device) -> Tensor:
    """The bits of the powers of two the int4 kernel ORs its nibbles into (`_nibbles`): a
    bf16 pair 2^7, an fp16 pair 2^10, an fp32 2^23. Made once per device (FusedDecoder asks
    before a graph is captured: `gpu.reserve`)."""
    if device not in _exponents:
        _exponents[device] = torch.tensor([0x43004300, 0x64006400, 0x4B000000],
                                          dtype=torch.int32, device=device)
    return _exponents[device]


@triton.jit
def _weight_rows(N, BLOCK_N: tl.constexpr, SILU: tl.constexpr, ROPE: tl.constexpr,
                 HALF: tl.constexpr):
    """The weight rows (outputs) a program's tile computes, and which of them exist: outputs
    pid * BLOCK_N on; or (SILU: the weight is [gate | up], N = 2I) the gate rows of outputs
    pid * BLOCK_N / 2 on, then the up rows of the same outputs; or (ROPE: the weight is
    q/k/v, heads of 2 HALF) the first halves' rows of pairs pid * BLOCK_N / 2 on (pair p:
    input p % HALF of head p // HALF), then the second halves' rows of the same pairs. Both
    interleaved at load, so that the epilogue holds what it combines (`_out`)."""
    j = tl.arange(0, BLOCK_N)
    if SILU or ROPE:
        at = tl.program_id(0) * (BLOCK_N // 2) + j % (BLOCK_N // 2)
        second = j // (BLOCK_N // 2)
        if SILU:
            return at + second * (N // 2), at < N // 2
        else:
            return (at // HALF) * 2 * HALF + at % HALF + second * HALF, at < N // 2
    else:
        cols = tl.program_id(0) * BLOCK_N + j
        return cols, cols < N


@triton.jit
def _rope_out(lo, hi, rows, out_ptr, rope, M, N, BLOCK_N: tl.constexpr):
    """A row tile's q/k/v pairs (`_weight_rows`, ROPE) rounded to the dtype, then as
    `_rope_write` takes them: q and k heads rotated at the row's position, q to out
    [M, HQ, D], k and v to the cache at the row's slot pos + row (`rope`: `_linear`'s)."""
    cos_ptr, sin_ptr, kv_ptr, pos_ptr, tree_ptr, C, HQ, HKV, D, TREE, TW = rope
    dtype = out_ptr.dtype.element_ty
    p = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    head, i = p // (D // 2), p % (D // 2)
    pos = tl.load(pos_ptr)
    slot = pos + rows
    at = slot
    if TREE:
        at = pos + tl.load(tree_ptr + rows * TW, mask=rows < M, other=0)
    inside = (rows[:, None] < M) & (p[None, :] < N // 2)
    angle = at[:, None] * D + i[None, :]
    c1 = tl.load(cos_ptr + angle, mask=inside, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + angle + D // 2, mask=inside, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + angle, mask=inside, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + angle + D // 2, mask=inside, other=0.0).to(tl.float32)
    x1, x2 = lo.to(dtype), hi.to(dtype)
    r1, r2 = _rotated(x1.to(tl.float32), x2.to(tl.float32), c1, c2, s1, s2, dtype)
    turn = (head < HQ + HKV)[None, :]  # q and k turn, v is written as it is
    y1, y2 = tl.where(turn, r1, x1), tl.where(turn, r2, x2)
    is_q = (head < HQ)[None, :]
    q_at = out_ptr + rows[:, None] * HQ * D + (head * D + i)[None, :]
    tl.store(q_at, y1, mask=inside & is_q)
    tl.store(q_at + D // 2, y2, mask=inside & is_q)
    # kv [2, HKV, C, D]: head HQ + h is k's head h, HQ + HKV + h v's head h
    kv_at = kv_ptr + ((head - HQ)[None, :] * C + slot[:, None]) * D + i[None, :]
    tl.store(kv_at, y1, mask=inside & ~is_q)
    tl.store(kv_at + D // 2, y2, mask=inside & ~is_q)


@triton.jit
def _out(total, rows, wrows, wok, out_ptr, b_ptr, M, N, HAS_BIAS: tl.constexpr,
         SILU: tl.constexpr, ROPE: tl.constexpr, rope, BLOCK_M: tl.constexpr,
         BLOCK_N: tl.constexpr):
    """A row tile's sums (plus bias) to out; SILU: silu(gate) * up of its outputs, each of
    gate and up rounded to the dtype first, then the SiLU, then the product (`_silu_mul`'s
    rounding: the bits of the gate/up linear and the SiLU kernel); ROPE: q rotated to out,
    k rotated and v to the cache (`_rope_out`: the bits of the linear and `_rope_write`)."""
    if HAS_BIAS:
        total += tl.load(b_ptr + wrows, mask=wok, other=0.0).to(tl.float32)[None, :]
    dtype = out_ptr.dtype.element_ty
    if ROPE:
        lo, hi = tl.split(tl.permute(tl.reshape(total, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
        _rope_out(lo, hi, rows, out_ptr, rope, M, N, BLOCK_N)
    elif SILU:
        g, u = tl.split(tl.permute(tl.reshape(total, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
        gate = g.to(dtype).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        cols = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(out_ptr + rows[:, None] * (N // 2) + cols[None, :],
                 (act * u.to(dtype).to(tl.float32)).to(dtype),
                 mask=(rows[:, None] < M) & (cols[None, :] < N // 2))
    else:
        tl.store(out_ptr + rows[:, None] * N + wrows[None, :], total.to(dtype),
                 mask=(rows[:, None] < M) & wok[None, :])


@triton.jit
def _store_rows(acc, rows, wrows, wok, split, out_ptr, b_ptr, part_ptr, M, N, PN,
                HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, SILU: tl.constexpr,
                ROPE: tl.constexpr, rope, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A row tile's sums: to out (`_out`) when K is whole; else this part's partial sums
    (`_finish` adds the parts), PN a row, at the tile's positions."""
    if SPLIT == 1:
        _out(acc, rows, wrows, wok, out_ptr, b_ptr, M, N, HAS_BIAS, SILU, ROPE, rope, BLOCK_M,
             BLOCK_N)
    else:
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        keep = (rows[:, None] < M) & (cols[None, :] < PN)
        tl.store(part_ptr + (split * M + rows[:, None]) * PN + cols[None, :], acc, mask=keep)


@triton.jit
def _reduce_rows(rows, wrows, wok, out_ptr, b_ptr, part_ptr, M, N, PN, HAS_BIAS: tl.constexpr,
                 SPLIT: tl.constexpr, SILU: tl.constexpr, ROPE: tl.constexpr, rope,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = (rows[:, None] < M) & (cols[None, :] < PN)
    total = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for s in range(SPLIT):  # in order: the same sum for a row whatever the pass's width
        total += tl.load(part_ptr + (s * M + rows[:, None]) * PN + cols[None, :], mask=keep,
                         other=0.0, cache_modifier=".cg")
    _out(total, rows, wrows, wok, out_ptr, b_ptr, M, N, HAS_BIAS, SILU, ROPE, rope, BLOCK_M,
         BLOCK_N)


@triton.jit
def _finish(acc0, acc1, acc2, r0, out_ptr, b_ptr, part_ptr, cnt_ptr, M, N,
            HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, SILU: tl.constexpr, ROPE: tl.constexpr, rope):
    """Store a program's three row tiles; with K split, the last of an output tile's SPLIT
    programs to arrive (an atomic count, acquire-release at GPU scope, after a barrier: every
    thread's partial stored first; the partials read back through L2, `.cg`) adds the parts
    in order 0..SPLIT-1 whichever program it is, and sets the count back to zero for the
    next launch. One kernel a linear, and a row's sum the same in a pass of any width."""
    split = tl.program_id(1)
    rows = r0 + tl.arange(0, BLOCK_M)
    wrows, wok = _weight_rows(N, BLOCK_N, SILU, ROPE, rope[8] // 2)
    PN = N
    if SILU or ROPE:
        PN = tl.num_programs(0) * BLOCK_N  # the partials of whole tiles, two halves each
    _store_rows(acc0, rows, wrows, wok, split, out_ptr, b_ptr, part_ptr, M, N, PN, HAS_BIAS,
                SPLIT, SILU, ROPE, rope, BLOCK_M, BLOCK_N)
    if r0 + BLOCK_M < M:
        _store_rows(acc1, rows + BLOCK_M, wrows, wok, split, out_ptr, b_ptr, part_ptr, M, N,
                    PN, HAS_BIAS, SPLIT, SILU, ROPE, rope, BLOCK_M, BLOCK_N)
    if r0 + 2 * BLOCK_M < M:
        _store_rows(acc2, rows + 2 * BLOCK_M, wrows, wok, split, out_ptr, b_ptr, part_ptr, M,
                    N, PN, HAS_BIAS, SPLIT, SILU, ROPE, rope, BLOCK_M, BLOCK_N)
    if SPLIT > 1:
        tl.debug_barrier()
        at = cnt_ptr + tl.program_id(2) * tl.num_programs(0) + tl.program_id(0)
        if tl.atomic_add(at, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
            _reduce_rows(rows, wrows, wok, out_ptr, b_ptr, part_ptr, M, N, PN, HAS_BIAS,
                         SPLIT, SILU, ROPE, rope, BLOCK_M, BLOCK_N)
            if r0 + BLOCK_M < M:
                _reduce_rows(rows + BLOCK_M, wrows, wok, out_ptr, b_ptr, part_ptr, M, N, PN,
                             HAS_BIAS, SPLIT, SILU, ROPE, rope, BLOCK_M, BLOCK_N)
            if r0 + 2 * BLOCK_M < M:
                _reduce_rows(rows + 2 * BLOCK_M, wrows, wok, out_ptr, b_ptr, part_ptr, M, N,
                             PN, HAS_BIAS, SPLIT, SILU, ROPE, rope, BLOCK_M, BLOCK_N)
            tl.atomic_xchg(at, 0, sem="relaxed", scope="gpu")


@triton.jit
def _rows_in(x_ptr, rows, kk, M, K, GATED: tl.constexpr):
    """A row tile's inputs kk: x's, or (GATED) silu(gate) * up of x = [gate | up] [M, 2K],
    rounded exactly as `_silu_mul` rounds (the MLP's SiLU kernel, folded into the down
    projection's loads)."""
    return _loaded_rows(x_ptr, rows, kk, K, (rows[:, None] < M) & (kk[None, :] < K), GATED)


@triton.jit
def _loaded_rows(x_ptr, rows, kk, K, inside, GATED: tl.constexpr):
    """`_rows_in` where `inside` says which inputs exist (None: all of them)."""
    if GATED:
        at = x_ptr + rows[:, None] * 2 * K + kk[None, :]
        gate = _masked_load(at, inside).to(tl.float32)
        up = _masked_load(at + K, inside).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty).to(tl.float32)
        return (act * up).to(x_ptr.dtype.element_ty)
    else:
        return _masked_load(x_ptr + rows[:, None] * K + kk[None, :], inside)


@triton.jit
def _masked_load(at, inside):
    """Zeros where not `inside`; None: every element is."""
    if inside is None:
        return tl.load(at)
    else:
        return tl.load(at, mask=inside, other=0.0)


@triton.jit
def _summed_in(x_ptr, r_ptr, rows, kk, M, K, HAS_RESIDUAL: tl.constexpr):
    """x + residual of a row tile's inputs kk, rounded to the dtype (`_add_rms_norm`'s sum)."""
    inside = (rows[:, None] < M) & (kk[None, :] < K)
    at = rows[:, None] * K + kk[None, :]
    x = tl.load(x_ptr + at, mask=inside, other=0.0)
    if HAS_RESIDUAL:
        x = (x.to(tl.float32) + tl.load(r_ptr + at, mask=inside, other=0.0).to(tl.float32)
             ).to(x_ptr.dtype.element_ty)
    return x


@triton.jit
def _row_scale(x_ptr, r_ptr, rows, M, K, eps, HAS_RESIDUAL: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean(s^2) + eps) of each row s = x + residual of a tile: the squares summed
    BLOCK_K inputs at a time, the blocks added in order 0..K/BLOCK_K - 1 (the order fixed by
    K alone; the same code, so the same bits, in every program that needs the row)."""
    ss = tl.zeros((BLOCK_M,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        s = _summed_in(x_ptr, r_ptr, rows, k0 + tl.arange(0, BLOCK_K), M, K,
                       HAS_RESIDUAL).to(tl.float32)
        ss += tl.sum(s * s, axis=1)
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _row_scales(x_ptr, r_ptr, r0, M, K, eps, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """NORM: `_row_scale` of a program's three row tiles (those the pass has); else unused."""
    scale0 = tl.zeros((BLOCK_M,), tl.float32)
    scale1 = tl.zeros((BLOCK_M,), tl.float32)
    scale2 = tl.zeros((BLOCK_M,), tl.float32)
    rows = r0 + tl.arange(0, BLOCK_M)
    if NORM:
        scale0 = _row_scale(x_ptr, r_ptr, rows, M, K, eps, HAS_RESIDUAL, BLOCK_M, BLOCK_K)
        if r0 + BLOCK_M < M:
            scale1 = _row_scale(x_ptr, r_ptr, rows + BLOCK_M, M, K, eps, HAS_RESIDUAL,
                                BLOCK_M, BLOCK_K)
        if r0 + 2 * BLOCK_M < M:
            scale2 = _row_scale(x_ptr, r_ptr, rows + 2 * BLOCK_M, M, K, eps, HAS_RESIDUAL,
                                BLOCK_M, BLOCK_K)
    return scale0, scale1, scale2


@triton.jit
def _normed_in(x_ptr, r_ptr, nw_ptr, s_ptr, rows, kk, M, K, scale, write,
               HAS_RESIDUAL: tl.constexpr):
    """A row tile's inputs kk of RMSNorm(x + residual) * weight, rounded as `_add_rms_norm`
    rounds (the normed state, then the product with the weight); the sum x + residual is
    stored too at inputs below `write` (K or 0: the stream's next residual)."""
    s = _summed_in(x_ptr, r_ptr, rows, kk, M, K, HAS_RESIDUAL)
    if HAS_RESIDUAL:
        tl.store(s_ptr + rows[:, None] * K + kk[None, :], s,
                 mask=(rows[:, None] < M) & (kk[None, :] < write))
    normed = (s.to(tl.float32) * scale[:, None]).to(x_ptr.dtype.element_ty)
    nw = tl.load(nw_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
    return (normed.to(tl.float32) * nw[None, :]).to(x_ptr.dtype.element_ty)


@triton.jit
def _tile_in(x_ptr, r_ptr, nw_ptr, s_ptr, rows, kk, M, K, scale, write, GATED: tl.constexpr,
             NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    if NORM:
        return _normed_in(x_ptr, r_ptr, nw_ptr, s_ptr, rows, kk, M, K, scale, write,
                          HAS_RESIDUAL)
    else:
        return _rows_in(x_ptr, rows, kk, M, K, GATED)


@triton.jit(do_not_specialize=["M"])  # one binary for every width (above)
def _linear(x_ptr, w_ptr, b_ptr, out_ptr, part_ptr, cnt_ptr, r_ptr, nw_ptr, s_ptr, cos_ptr,
            sin_ptr, kv_ptr, pos_ptr, tree_ptr, M, N, K, STEPS, eps, C,
            HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, GATED: tl.constexpr,
            NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SILU: tl.constexpr,
            ROPE: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
            TREE: tl.constexpr, TW: tl.constexpr):
    """Program (output tile, part of K, group of 3 row tiles): each weight tile is loaded once
    and multiplied into every row tile the pass has (a pass of <= 48 rows: one group).
    NORM: the inputs are RMSNorm(x + residual) * weight (`_add_rms_norm`'s, folded into the
    loads): each program first takes the sum of squares of each of its rows over the whole
    of K (`_row_scale`, one order fixed by K), so every part of K normalises a row by the
    same scale; the first output tile's programs also store x + residual (`s_ptr`).
    SILU: the outputs are silu(gate) * up of the [gate | up] weight's (`_weight_rows`).
    ROPE: the weight is q/k/v of HQ, HKV, HKV heads of D, and the epilogue is `_rope_write`'s
    (`_rope_out`): q rotated to out, k rotated and v to the cache kv [2, HKV, C, D] at slots
    pos + row, rows rotated at pos + row or, a token tree's (TREE), at pos + their depth."""
    r0 = tl.program_id(2) * 3 * BLOCK_M
    split = tl.program_id(1)
    rows = r0 + tl.arange(0, BLOCK_M)
    rope = (cos_ptr, sin_ptr, kv_ptr, pos_ptr, tree_ptr, C, HQ, HKV, D, TREE, TW)
    wrows, wok = _weight_rows(N, BLOCK_N, SILU, ROPE, D // 2)
    ks = tl.arange(0, BLOCK_K)
    write = K - K * tl.minimum(tl.program_id(0), 1)  # K in the first output tile, else 0
    scale0, scale1, scale2 = _row_scales(x_ptr, r_ptr, r0, M, K, eps, NORM, HAS_RESIDUAL,
                                         BLOCK_M, BLOCK_K)
    acc0 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(split * STEPS // SPLIT, (split + 1) * STEPS // SPLIT):
        kk = step * BLOCK_K + ks
        w = tl.load(w_ptr + wrows[:, None] * K + kk[None, :],
                    mask=wok[:, None] & (kk[None, :] < K), other=0.0)
        x = _tile_in(x_ptr, r_ptr, nw_ptr, s_ptr, rows, kk, M, K, scale0, write, GATED, NORM,
                     HAS_RESIDUAL)
        acc0 = tl.dot(x.to(w.dtype), tl.trans(w), acc0, input_precision="ieee")
        if r0 + BLOCK_M < M:
            x = _tile_in(x_ptr, r_ptr, nw_ptr, s_ptr, rows + BLOCK_M, kk, M, K, scale1, write,
                         GATED, NORM, HAS_RESIDUAL)
            acc1 = tl.dot(x.to(w.dtype), tl.trans(w), acc1, input_precision="ieee")
        if r0 + 2 * BLOCK_M < M:
            x = _tile_in(x_ptr, r_ptr, nw_ptr, s_ptr, rows + 2 * BLOCK_M, kk, M, K, scale2,
                         write, GATED, NORM, HAS_RESIDUAL)
            acc2 = tl.dot(x.to(w.dtype), tl.trans(w), acc2, input_precision="ieee")
    _finish(acc0, acc1, acc2, r0, out_ptr, b_ptr, part_ptr, cnt_ptr, M, N, HAS_BIAS,
            SPLIT, BLOCK_M, BLOCK_N, SILU, ROPE, rope)


@triton.jit
def _nibbles(words, k: tl.constexpr, bits, dtype: tl.constexpr):
    """Inputs 2k and 2k + 1 of each packed word (nibbles k and k + 4: pack_int4's order) as
    floats q + `_offset(dtype)`, exactly, by the exponent trick instead of an integer-to-float
    conversion: the nibble ORed into the low mantissa bits of a power of two 2^e whose last
    mantissa bit weighs 1 is the float 2^e + q. `bits` holds 2^e's bits (`exponents`). bf16
    (2^7, the production path) does a pair per 32-bit register with one shift and one LOP3
    and no arithmetic: q + 128, the offset taken off after the product (`_int4_tile`). fp32
    (2^23, the interpreter's tests) one at a time, then minus 2^23 - 128: q + 128 exactly,
    the same values and sums as bf16's. fp16 (2^10) a pair per register, minus 1032 (one
    packed subtract): q - 8, centred (q + 1024 would cost fp16's sums too many bits)."""
    if dtype == tl.float32:
        lo = (((words >> (4 * k)) & 0xF) | bits).to(tl.float32, bitcast=True)
        hi = (((words >> (4 * k + 16)) & 0xF) | bits).to(tl.float32, bitcast=True)
        return lo - 8388480.0, hi - 8388480.0
    else:
        pair = ((words >> (4 * k)) & 0x000F000F) | bits
        lo = pair.to(tl.int16).to(dtype, bitcast=True)
        hi = (pair >> 16).to(tl.int16).to(dtype, bitcast=True)
        if dtype == tl.float16:
            return (lo - 1032.0).to(dtype), (hi - 1032.0).to(dtype)
        else:
            return lo, hi


@triton.jit
def _offset(dtype: tl.constexpr):
    """What `_nibbles` adds to each int4 value q: -8 in fp16, 2^7 otherwise."""
    if dtype == tl.float16:
        return -8.0
    else:
        return 128.0


@triton.jit
def _exponent_at(dtype: tl.constexpr):
    """Where `exponents` keeps a dtype's bits."""
    if dtype == tl.bfloat16:
        return 0
    elif dtype == tl.float16:
        return 1
    else:
        return 2


@triton.jit
def _unpacked(words, bits, BLOCK_N: tl.constexpr, GROUP: tl.constexpr, dtype: tl.constexpr):
    """A group of a weight tile, [BLOCK_N, GROUP] words' values q + `_offset` in input order."""
    l0, h0 = _nibbles(words, 0, bits, dtype)
    l1, h1 = _nibbles(words, 1, bits, dtype)
    l2, h2 = _nibbles(words, 2, bits, dtype)
    l3, h3 = _nibbles(words, 3, bits, dtype)
    lo = tl.reshape(tl.join(tl.join(l0, l2), tl.join(l1, l3)), (BLOCK_N, GROUP // 8, 4))
    hi = tl.reshape(tl.join(tl.join(h0, h2), tl.join(h1, h3)), (BLOCK_N, GROUP // 8, 4))
    return tl.reshape(tl.join(lo, hi), (BLOCK_N, GROUP))


@triton.jit
def _normed_part(x_ptr, r_ptr, nw_ptr, s_ptr, h_ptr, r0, first, last, M, K, scale0, scale1,
                 scale2, write, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
                 GROUP: tl.constexpr):
    """A program's rows' normalised inputs (`_normed_in`) over its groups first..last - 1,
    stored to h_ptr [M, K] before its main loop, which then reads them as a plain linear's
    inputs: each input normalised once a program, not once a row tile and group in the loop.
    Every program that stores an input of h stores the same bits (the same code on the same
    inputs), and a program reads back only inputs it stored itself, after a barrier."""
    rows = r0 + tl.arange(0, BLOCK_M)
    for step in range(first, last):
        kk = step * GROUP + tl.arange(0, GROUP)
        _store_normed(x_ptr, r_ptr, nw_ptr, s_ptr, h_ptr, rows, kk, M, K, scale0, write,
                      HAS_RESIDUAL)
        if r0 + BLOCK_M < M:
            _store_normed(x_ptr, r_ptr, nw_ptr, s_ptr, h_ptr, rows + BLOCK_M, kk, M, K,
                          scale1, write, HAS_RESIDUAL)
        if r0 + 2 * BLOCK_M < M:
            _store_normed(x_ptr, r_ptr, nw_ptr, s_ptr, h_ptr, rows + 2 * BLOCK_M, kk, M, K,
                          scale2, write, HAS_RESIDUAL)
    tl.debug_barrier()


@triton.jit
def _store_normed(x_ptr, r_ptr, nw_ptr, s_ptr, h_ptr, rows, kk, M, K, scale, write,
                  HAS_RESIDUAL: tl.constexpr):
    h = _normed_in(x_ptr, r_ptr, nw_ptr, s_ptr, rows, kk, M, K, scale, write, HAS_RESIDUAL)
    tl.store(h_ptr + rows[:, None] * K + kk[None, :], h,
             mask=(rows[:, None] < M) & (kk[None, :] < K))


@triton.jit
def _int4_tile(x_ptr, rows, kk, K, w, ones, scale, shift, acc, GATED: tl.constexpr):
    """A row tile's group: scale * (x . (q + c)) + shift * (x . 1), shift = zero - (c + 8) *
    scale: x . ((q - 8) * scale + zero) without rounding a dequantized weight. `rows` all
    exist (the caller's clamp)."""
    x = _loaded_rows(x_ptr, rows, kk, K, None, GATED)
    part = tl.dot(x, tl.trans(w), input_precision="ieee")
    total = tl.dot(x, ones, input_precision="ieee")  # each row's sum, in every column
    return acc + part * scale[None, :] + total * shift[None, :]


@triton.jit(do_not_specialize=["M"])  # one binary for every width (above)
def _linear_int4(x_ptr, q_ptr, sz_ptr, ex_ptr, b_ptr, out_ptr, part_ptr, cnt_ptr, r_ptr, nw_ptr,
                 s_ptr, h_ptr, cos_ptr, sin_ptr, kv_ptr, pos_ptr, tree_ptr, M, N, K, KW, STEPS,
                 eps, C,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 GROUP: tl.constexpr, SPLIT: tl.constexpr, GATED: tl.constexpr,
                 NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SILU: tl.constexpr,
                 ROPE: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                 TREE: tl.constexpr, TW: tl.constexpr):
    """q_ptr: int32 [N, KW = K / 8] (pack_int4's order); sz_ptr: [N, K / GROUP, 2] scale
    and zero (output-major, so that a slice of outputs is a view); ex_ptr: `exponents`. A
    step is one group: its words read once, unpacked to q + c exactly (`_nibbles`, c =
    `_offset`), multiplied into each row tile, and a row's group sum is scale * (x . (q + c))
    + (zero - (c + 8) * scale) * (x . 1) (`_int4_tile`): y = sum over groups of
    x . ((q - 8) * scale + zero), with no per-weight rounding of the dequantized value.
    Programs, NORM, SILU and ROPE as `_linear`'s, but NORM's inputs are normalised once a
    program, before the loop, into h_ptr [M, K] (`_normed_part`), which the loop reads."""
    r0 = tl.program_id(2) * 3 * BLOCK_M
    split = tl.program_id(1)
    rows = r0 + tl.arange(0, BLOCK_M)
    rope = (cos_ptr, sin_ptr, kv_ptr, pos_ptr, tree_ptr, C, HQ, HKV, D, TREE, TW)
    wrows, _ = _weight_rows(N, BLOCK_N, SILU, ROPE, D // 2)
    write = K - K * tl.minimum(tl.program_id(0), 1)  # K in the first output tile, else 0
    scale0, scale1, scale2 = _row_scales(x_ptr, r_ptr, r0, M, K, eps, NORM, HAS_RESIDUAL,
                                         BLOCK_M, GROUP)
    ks = tl.arange(0, GROUP)
    js = tl.arange(0, GROUP // 8)
    dtype = x_ptr.dtype.element_ty
    ones = tl.full((GROUP, BLOCK_N), 1.0, dtype)
    # The exponent's bits read from memory, not written as a literal: under this kernel's
    # registers ptxas rematerializes a literal before each LOP3 that ORs it in (an IMAD a
    # use, docs/gpu-kernels.md); a loaded value it keeps in one register.
    bits = tl.load(ex_ptr + _exponent_at(dtype))
    offset8 = _offset(dtype) + 8.0
    acc0 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    first, last = split * STEPS // SPLIT, (split + 1) * STEPS // SPLIT
    if NORM:
        _normed_part(x_ptr, r_ptr, nw_ptr, s_ptr, h_ptr, r0, first, last, M, K, scale0, scale1,
                     scale2, write, HAS_RESIDUAL, BLOCK_M, GROUP)
        x_ptr = h_ptr
    # Loads in the loop without masks: a weight row past N reads row N - 1, an input row
    # past M row M - 1 (K is whole groups). Their products land only in outputs and rows that
    # are never stored, and no row's sums depend on another row's inputs.
    wrow = tl.minimum(wrows, N - 1)
    in0 = tl.minimum(rows, M - 1)
    in1 = tl.minimum(rows + BLOCK_M, M - 1)
    in2 = tl.minimum(rows + 2 * BLOCK_M, M - 1)
    for step in range(first, last):
        words = tl.load(q_ptr + wrow[:, None] * KW + (step * (GROUP // 8) + js)[None, :])
        w = _unpacked(words, bits, BLOCK_N, GROUP, dtype)
        at = sz_ptr + wrow * (K // GROUP) * 2 + step * 2
        scale = tl.load(at).to(tl.float32)
        shift = tl.load(at + 1).to(tl.float32) - offset8 * scale
        kk = step * GROUP + ks
        acc0 = _int4_tile(x_ptr, in0, kk, K, w, ones, scale, shift, acc0, GATED)
        if r0 + BLOCK_M < M:
            acc1 = _int4_tile(x_ptr, in1, kk, K, w, ones, scale, shift, acc1, GATED)
        if r0 + 2 * BLOCK_M < M:
            acc2 = _int4_tile(x_ptr, in2, kk, K, w, ones, scale, shift, acc2, GATED)
    _finish(acc0, acc1, acc2, r0, out_ptr, b_ptr, part_ptr, cnt_ptr, M, N, HAS_BIAS,
            SPLIT, BLOCK_M, BLOCK_N, SILU, ROPE, rope)


def linear(x: Tensor, w, bias: Tensor | None, n: int, int4: bool,
           scales_and_zeros: Tensor | None, gated: bool = False,
           norm: tuple[Tensor | None, Tensor, float] | None = None,
           silu: bool = False, rope=None):
    """norm = (residual, weight, eps): the inputs RMSNorm(x + residual) * weight; then
    (out, x + residual) (x itself where residual is None). silu: the weight is [gate | up]
    (n = 2I) and the output silu(gate) * up [M, I], in the epilogue. rope (a gpu.Rope): the
    weight is q/k/v and the output rotated q [M, HQ, D], k and v written to rope.kv, in the
    epilogue."""
    m, k = x.shape
    if gated and (norm is not None or silu or rope is not None):
        raise ValueError("the SiLU in the loads takes a plain linear")
    if (silu or rope is not None) and n % 2 or silu and rope is not None:
        raise ValueError("the SiLU and rotary epilogues take one even [gate | up] or q/k/v")
    x = x.contiguous()
    if m > CHUNK_ROWS:
        if rope is not None:
            raise ValueError(f"the rotary epilogue takes passes of up to {CHUNK_ROWS} rows")
        return _chunked(x, w, bias, n, int4, scales_and_zeros, gated, norm, silu)
    k = k // 2 if gated else k  # gated: x is [gate | up], the inputs silu(gate) * up
    paired = silu or rope is not None
    if rope is None:
        out = torch.empty(m, n // 2 if silu else n, dtype=x.dtype, device=x.device)
    else:
        out = torch.empty(m, rope.q_heads, rope.kv.shape[-1], dtype=x.dtype, device=x.device)
    bn = block_n(n, x.device, int4)
    bk = GROUP if int4 else BLOCK_K
    split = splits(n, k, bn, bk, sm_count(x.device))
    tiles = triton.cdiv(n // 2, bn // 2) if paired else triton.cdiv(n, bn)
    grid = (tiles, split, triton.cdiv(m, ROW_TILES * BLOCK_M))
    b = bias if bias is not None else out  # any pointer: not read without a bias
    width = tiles * bn if paired else n  # a partial row: whole tiles when paired
    part = torch.empty(split if split > 1 else 1, m if split > 1 else 1,
                       width if split > 1 else 1,
                       dtype=torch.float32, device=x.device)  # partial sums (K split)
    count = counters(x.device, grid[0] * grid[2])
    steps = triton.cdiv(k, bk)
    residual, norm_w, eps = norm if norm is not None else (None, x, 0.0)
    summed = x if residual is None else torch.empty_like(x)
    r = x if residual is None else residual.contiguous()
    epilogue = _rope_args(rope, out)
    if int4:
        normed = torch.empty_like(x) if norm is not None else x  # `_normed_part`'s inputs
        _linear_int4[grid](x, w, scales_and_zeros, exponents(x.device), b, out, part, count, r,
                           norm_w, summed, normed,
                           *epilogue[:5], m, n, k, k // 8, steps, eps, epilogue[5],
                           bias is not None, BLOCK_M, bn, GROUP, split, gated,
                           norm is not None, residual is not None, silu, *epilogue[6:],
                           num_warps=INT4_WARPS)
    else:
        _linear[grid](x, w, b, out, part, count, r, norm_w, summed, *epilogue[:5], m, n, k,
                      steps, eps, epilogue[5], bias is not None, BLOCK_M, bn, BLOCK_K, split,
                      gated, norm is not None, residual is not None, silu, *epilogue[6:])
    return out if norm is None else (out, summed)


def _rope_args(rope, out: Tensor) -> tuple:
    """The rotary epilogue's arguments as the linears take them: 5 pointers (cos, sin, kv,
    pos, tree), the capacity, then ROPE, HQ, HKV, D, TREE, TW; placeholders without it."""
    if rope is None:
        return (out, out, out, out, out, 1, False, 1, 1, 2, False, 1)
    tree = rope.tree
    return (rope.cos, rope.sin, rope.kv, rope.pos, rope.pos if tree is None else tree,
            rope.kv.shape[2], True, rope.q_heads, rope.kv_heads, rope.kv.shape[-1],
            tree is not None, 1 if tree is None else tree.shape[1])


def _chunked(x: Tensor, w, bias: Tensor | None, n: int, int4: bool,
             scales_and_zeros: Tensor | None, gated: bool,
             norm: tuple[Tensor | None, Tensor, float] | None, silu: bool):
    """A wide call as calls of CHUNK_ROWS rows (a row's bits do not depend on the chunking)."""
    done = []
    for i in range(0, x.shape[0], CHUNK_ROWS):
        part = None
        if norm is not None:
            residual, norm_w, eps = norm
            part = (None if residual is None else residual[i:i + CHUNK_ROWS], norm_w, eps)
        done.append(linear(x[i:i + CHUNK_ROWS], w, bias, n, int4, scales_and_zeros, gated,
                           part, silu))
    if norm is None:
        return torch.cat(done)
    return torch.cat([o for o, _ in done]), torch.cat([s for _, s in done])


@triton.jit
def _add_rms_norm(x_ptr, r_ptr, w_ptr, normed_ptr, summed_ptr, H, eps, HAS_RESIDUAL: tl.constexpr,
                  BLOCK_H: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    inside = cols < H
    x = tl.load(x_ptr + row * H + cols, mask=inside, other=0.0)
    if HAS_RESIDUAL:
        x = (x.to(tl.float32) + tl.load(r_ptr + row * H + cols, mask=inside, other=0.0)
             .to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(summed_ptr + row * H + cols, x, mask=inside)
    s = x.to(tl.float32)
    variance = tl.sum(s * s, axis=0) / H
    normed = (s * (1.0 / tl.sqrt(variance + eps))).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(normed_ptr + row * H + cols,
             (normed.to(tl.float32) * w).to(normed_ptr.dtype.element_ty), mask=inside)


def add_rms_norm(x: Tensor, residual: Tensor | None, weight: Tensor,
                 eps: float) -> tuple[Tensor, Tensor]:
    m, h = x.shape
    x = x.contiguous()
    normed = torch.empty_like(x)
    summed = x if residual is None else torch.empty_like(x)
    r = x if residual is None else residual.contiguous()
    _add_rms_norm[(m,)](x, r, weight, normed, summed, h, eps, residual is not None,
                        triton.next_power_of_2(h), num_warps=8 if h >= 4096 else 4)
    return normed, summed


@triton.jit
def _rotated(x1, x2, c1, c2, s1, s2, dtype: tl.constexpr):
    """transformers' x * cos + rotate_half(x) * sin on the two halves, each product rounded."""
    lo = ((x1 * c1).to(dtype).to(tl.float32) + (-x2 * s1).to(dtype).to(tl.float32)).to(dtype)
    hi = ((x2 * c2).to(dtype).to(tl.float32) + (x1 * s2).to(dtype).to(tl.float32)).to(dtype)
    return lo, hi


@triton.jit
def _rope_heads(src, dst, dst_stride, c1, c2, s1, s2, COUNT: tl.constexpr, BLOCK: tl.constexpr,
                D: tl.constexpr, BLOCK_HALF: tl.constexpr, ROTATE: tl.constexpr):
    """COUNT heads of D at src (contiguous) to dst (heads dst_stride apart), rotated or not."""
    heads = tl.arange(0, BLOCK)
    i = tl.arange(0, BLOCK_HALF)
    inside = (heads < COUNT)[:, None] & (i < D // 2)[None, :]
    x1 = tl.load(src + heads[:, None] * D + i[None, :], mask=inside, other=0.0)
    x2 = tl.load(src + heads[:, None] * D + D // 2 + i[None, :], mask=inside, other=0.0)
    if ROTATE:
        x1, x2 = _rotated(x1.to(tl.float32), x2.to(tl.float32), c1, c2, s1, s2,
                          src.dtype.element_ty)
    out = dst + heads[:, None] * dst_stride + i[None, :]
    tl.store(out, x1, mask=inside)
    tl.store(out + D // 2, x2, mask=inside)


@triton.jit
def _rope_write(qkv_ptr, cos_ptr, sin_ptr, kv_ptr, q_ptr, pos_ptr, tree_ptr, C, HQ: tl.constexpr,
                HKV: tl.constexpr, D: tl.constexpr, BLOCK_HQ: tl.constexpr,
                BLOCK_HKV: tl.constexpr, BLOCK_HALF: tl.constexpr, TREE: tl.constexpr,
                TW: tl.constexpr):
    """One program per (row, part): part 0 rotates the row's q heads, part 1 its k heads and
    writes them and the v heads to the cache at the row's slot. A row's slot is pos + row;
    its position too, but in a token tree (TREE) pos + its depth (`tree`: see attention)."""
    row, part = tl.program_id(0), tl.program_id(1)
    slot = tl.load(pos_ptr) + row
    p = slot
    if TREE:
        p = tl.load(pos_ptr) + tl.load(tree_ptr + row * TW)
    i = tl.arange(0, BLOCK_HALF)
    half = i < D // 2
    c1 = tl.load(cos_ptr + p * D + i, mask=half, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + p * D + D // 2 + i, mask=half, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + p * D + i, mask=half, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + p * D + D // 2 + i, mask=half, other=0.0).to(tl.float32)[None, :]
    src = qkv_ptr + row * (HQ + 2 * HKV) * D
    if part == 0:
        _rope_heads(src, q_ptr + row * HQ * D, D, c1, c2, s1, s2, HQ, BLOCK_HQ, D, BLOCK_HALF, True)
    else:  # kv[0, head, slot] and kv[1, head, slot]
        _rope_heads(src + HQ * D, kv_ptr + slot * D, C * D, c1, c2, s1, s2, HKV, BLOCK_HKV, D,
                    BLOCK_HALF, True)
        _rope_heads(src + (HQ + HKV) * D, kv_ptr + (HKV * C + slot) * D, C * D, c1, c2, s1, s2,
                    HKV, BLOCK_HKV, D, BLOCK_HALF, False)


def rope_write(qkv: Tensor, cos: Tensor, sin: Tensor, kv: Tensor, pos: Tensor, hq: int,
               hkv: int, tree: Tensor | None = None) -> Tensor:
    m = qkv.shape[0]
    d = kv.shape[-1]
    q = torch.empty(m, hq, d, dtype=qkv.dtype, device=qkv.device)
    _rope_write[(m, 2)](qkv.contiguous(), cos, sin, kv, q, pos, pos if tree is None else tree,
                        kv.shape[2], hq, hkv, d, triton.next_power_of_2(hq),
                        triton.next_power_of_2(hkv), triton.next_power_of_2(d // 2),
                        tree is not None, 1 if tree is None else tree.shape[1])
    return q


@triton.jit
def _silu_mul(gu_ptr, out_ptr, I, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < I
    gate = tl.load(gu_ptr + row * 2 * I + cols, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * 2 * I + I + cols, mask=inside, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * I + cols, (act * up).to(out_ptr.dtype.element_ty), mask=inside)


def silu_mul(gate_up: Tensor) -> Tensor:
    m, i2 = gate_up.shape
    out = torch.empty(m, i2 // 2, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(i2 // 2))
    _silu_mul[(m, triton.cdiv(i2 // 2, block))](gate_up.contiguous(), out, i2 // 2, block)
    return out


@triton.jit
def _branch_slots(tree_ptr, row, s, pos, TW: tl.constexpr):
    """Where a tree row finds the keys of positions s (a block of them): below pos the
    cache's own slots; at pos + t, the slot of its ancestor at depth t (itself at its own
    depth); -1 past its depth (masked)."""
    depth = tl.load(tree_ptr + row * TW)
    t = s - pos
    node = tl.load(tree_ptr + row * TW + 1 + t, mask=(t >= 0) & (t <= depth), other=-1)
    return tl.where(t < 0, s, tl.where(node >= 0, pos + node, -1))


@triton.jit(do_not_specialize=["M"])  # one binary for every width (above)
def _attend_chunk(q_ptr, kv_ptr, pos_ptr, tree_ptr, acc_ptr, max_ptr, sum_ptr, out_ptr, cnt_ptr,
                  M, C, scale, HQ: tl.constexpr, HKV: tl.constexpr, GROUPS: tl.constexpr,
                  GP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, BLOCK_KV: tl.constexpr,
                  BLOCK_C: tl.constexpr, TREE: tl.constexpr, TW: tl.constexpr):
    """One program per (key/value head, chunk of CHUNK slots, tile of rows): the tile holds
    BLOCK_M rows times the GROUPS query heads sharing the key/value head (padded to GP), and
    leaves each row's running max, sum and unnormalised output over the chunk. The last of a
    (head, row tile)'s programs to arrive (an atomic count, acquire-release at GPU scope after
    a barrier, as `_finish`'s split-K; the partials read back through L2) merges the chunks of
    each of the tile's rows in slot order (`_merge_row`) and resets the count: one kernel, and
    the merge's order fixed whichever program does it.

    TREE: the rows are a token tree's (`tree` [M, TW]: per row its depth, then its ancestor
    at each depth, itself last). Each row sees positions up to pos + its depth, and at
    position pos + t the keys of its ancestor at depth t: the keys a one-token pass along its
    branch sees at that position. A row off the tree's first branch (its slot is not its
    position) gets each block that reaches past pos from a tile product of its own keys; the
    tile's other rows do not change a row's bits, so it is the block of that one-token pass."""
    h, chunk, tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    pos = tl.load(pos_ptr)
    start = chunk * CHUNK
    if start < pos + M:  # else no row of the pass sees this chunk (the combine never reads it)
        i = tl.arange(0, BLOCK_M * GP)
        m = tile * BLOCK_M + i // GP
        g = i % GP
        valid = (m < M) & (g < GROUPS)
        d = tl.arange(0, BLOCK_D)
        q = tl.load(q_ptr + ((m * HQ + h * GROUPS + g) * D)[:, None] + d[None, :],
                    mask=valid[:, None] & (d[None, :] < D), other=0.0)
        last = pos + m  # each row's own position: it sees slots 0..last
        if TREE:
            last = pos + tl.load(tree_ptr + m * TW, mask=m < M, other=0)
        run_max = tl.full((BLOCK_M * GP,), float("-inf"), tl.float32)
        run_sum = tl.zeros((BLOCK_M * GP,), tl.float32)
        acc = tl.zeros((BLOCK_M * GP, BLOCK_D), tl.float32)
        stop = tl.minimum(start + CHUNK, pos + M)
        for s0 in range(start, stop, BLOCK_KV):
            s = s0 + tl.arange(0, BLOCK_KV)
            at = (h * C + s)[:, None] * D + d[None, :]
            inside = (s[:, None] < C) & (d[None, :] < D)
            k = tl.load(kv_ptr + at, mask=inside, other=0.0)
            v = tl.load(kv_ptr + HKV * C * D + at, mask=inside, other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            if TREE:
                if s0 + BLOCK_KV > pos:
                    for r in range(BLOCK_M):  # a loop, not unrolled: fewer registers live
                        row = tile * BLOCK_M + r
                        if row < M:
                            if tl.load(tree_ptr + row * TW) != row:  # off the first branch
                                slots = _branch_slots(tree_ptr, row, s, pos, TW)
                                own = (h * C + slots)[:, None] * D + d[None, :]
                                k_row = tl.load(kv_ptr + own, mask=(slots >= 0)[:, None]
                                                & (d[None, :] < D), other=0.0)
                                row_scores = tl.dot(q, tl.trans(k_row),
                                                    input_precision="ieee") * scale
                                scores = tl.where((m == row)[:, None], row_scores, scores)
            scores = tl.where(s[None, :] <= last[:, None], scores, float("-inf"))
            new_max = tl.maximum(run_max, tl.max(scores, axis=1))
            safe = tl.where(new_max == float("-inf"), 0.0, new_max)  # a row that saw nothing yet
            p = tl.exp(scores - safe[:, None])
            alpha = tl.exp(run_max - safe)
            run_sum = run_sum * alpha + tl.sum(p, axis=1)
            scaled = acc * alpha[:, None]
            if TREE:
                if s0 + BLOCK_KV > pos:
                    # An off-branch row's product with its own values lands in `scaled`, and
                    # its p is zeroed for the tile's product below, which then adds exact
                    # zeros to it (x + 0 = x): one accumulator tile fewer live than keeping
                    # the row's product beside the tile's (which spilled on sm_90).
                    off = tl.zeros((BLOCK_M * GP,), tl.int1)
                    for r in range(BLOCK_M):  # a loop, not unrolled: fewer registers live
                        row = tile * BLOCK_M + r
                        if row < M:
                            if tl.load(tree_ptr + row * TW) != row:
                                slots = _branch_slots(tree_ptr, row, s, pos, TW)
                                own = (h * C + slots)[:, None] * D + d[None, :]
                                v_row = tl.load(kv_ptr + HKV * C * D + own,
                                                mask=(slots >= 0)[:, None] & (d[None, :] < D),
                                                other=0.0)
                                row_acc = tl.dot(p.to(v.dtype), v_row, scaled,
                                                 input_precision="ieee")
                                scaled = tl.where((m == row)[:, None], row_acc, scaled)
                                off = off | (m == row)
                    p = tl.where(off[:, None], 0.0, p)
            acc = tl.dot(p.to(v.dtype), v, scaled, input_precision="ieee")
            run_max = new_max
        at = (chunk * HKV + h) * M * GP + m * GP + g  # [chunk, HKV, M, GP]: only real rows kept
        keep = m < M
        tl.store(max_ptr + at, run_max, mask=keep)
        tl.store(sum_ptr + at, run_sum, mask=keep)
        tl.store(acc_ptr + at[:, None] * BLOCK_D + d[None, :], acc, mask=keep[:, None])
    tl.debug_barrier()
    count = cnt_ptr + h * tl.num_programs(2) + tile
    if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == tl.num_programs(1) - 1:
        for r in range(BLOCK_M):  # a loop, not unrolled: one row's merge live at a time
            row = tile * BLOCK_M + r
            if row < M:
                _merge_row(acc_ptr, max_ptr, sum_ptr, out_ptr, pos, row, h, M, HQ, HKV, GROUPS,
                           GP, D, BLOCK_D, CHUNK, BLOCK_C)
        tl.atomic_xchg(count, 0, sem="relaxed", scope="gpu")


@triton.jit
def _merge_row(acc_ptr, max_ptr, sum_ptr, out_ptr, pos, row, h, M, HQ: tl.constexpr,
               HKV: tl.constexpr, GROUPS: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
               BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_C: tl.constexpr):
    """A row's output for the query heads of key/value head h: its chunks merged in slot
    order, BLOCK_C at a time (a fixed block: its sums' order never depends on the number of
    chunks). A chunk past the row's own position, or past the pass's, weighs exactly 0 (max
    -inf, sum 0), which leaves every sum's bits as they were."""
    g = tl.arange(0, GP)
    d = tl.arange(0, BLOCK_D)
    run_max = tl.full((GP,), float("-inf"), tl.float32)
    run_sum = tl.zeros((GP,), tl.float32)
    acc = tl.zeros((GP, BLOCK_D), tl.float32)
    chunks = (pos + M + CHUNK - 1) // CHUNK
    for c0 in range(0, chunks, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        seen = (c < chunks)[:, None]
        at = (c[:, None] * HKV + h) * M * GP + row * GP + g[None, :]  # [BLOCK_C, GP]
        c_max = tl.load(max_ptr + at, mask=seen, other=float("-inf"), cache_modifier=".cg")
        new_max = tl.maximum(run_max, tl.max(c_max, axis=0))
        weight = tl.where(c_max == float("-inf"), 0.0, tl.exp(c_max - new_max[None, :]))
        a_old = tl.exp(run_max - new_max)  # 0 at the first block; 1 where nothing new was seen
        c_sum = tl.load(sum_ptr + at, mask=seen, other=0.0, cache_modifier=".cg")
        run_sum = run_sum * a_old + tl.sum(c_sum * weight, axis=0)
        c_acc = tl.load(acc_ptr + at[:, :, None] * BLOCK_D + d[None, None, :],
                        mask=seen[:, :, None], other=0.0, cache_modifier=".cg")
        acc = acc * a_old[:, None] + tl.sum(c_acc * weight[:, :, None], axis=0)
        run_max = new_max
    out = (acc / run_sum[:, None]).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + (row * HQ + h * GROUPS + g)[:, None] * D + d[None, :], out,
             mask=(g < GROUPS)[:, None] & (d < D)[None, :])


def attention(q: Tensor, kv: Tensor, pos: Tensor, scale: float, chunk: int = CHUNK,
              block_kv: int = BLOCK_KV, tree: Tensor | None = None) -> Tensor:
    m, hq, d = q.shape
    hkv, capacity = kv.shape[1], kv.shape[2]
    groups = hq // hkv
    gp, bd = triton.next_power_of_2(groups), max(16, triton.next_power_of_2(d))
    chunks = triton.cdiv(capacity, chunk)  # by capacity, so that a graph's grid is fixed
    f32 = dict(dtype=torch.float32, device=q.device)
    run_max = torch.empty(chunks, hkv, m, gp, **f32)
    run_sum = torch.empty(chunks, hkv, m, gp, **f32)
    acc = torch.empty(chunks, hkv, m, gp, bd, **f32)
    out = torch.empty_like(q)
    tiles = triton.cdiv(m, BLOCK_M)
    count = counters(q.device, hkv * tiles)  # arrivals per (head, row tile): the merge's
    _attend_chunk[(hkv, chunks, tiles)](
        q.contiguous(), kv, pos, pos if tree is None else tree, acc, run_max, run_sum, out,
        count, m, capacity, scale, hq, hkv, groups, gp, d, bd, BLOCK_M, chunk, block_kv,
        BLOCK_C, tree is not None, 1 if tree is None else tree.shape[1],
        num_warps=8 if BLOCK_M * gp >= 64 else 4)
    return out
