"""The Triton kernels behind kernels/gpu (imported only where Triton is).

The rule every kernel keeps: a row's result does not depend on how many rows the call has.
Rows go in tiles of BLOCK_M = 16 (a tile's unused rows are zeros), every reduction runs in one
order fixed by the operands' shapes (never by the number of rows), and accumulation is fp32.
A linear splits its work over outputs only, never over its inputs; attention walks the cache
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


def block_n(n: int, device: torch.device, int4: bool = False) -> int:
    """Outputs per linear program, fixed by N alone (never by M): on a GPU, narrow blocks
    give a GEMV at batch 1 enough programs to stream the weights from every SM; on a CPU
    (Triton's interpreter, which runs programs one by one) wide ones, for fewer programs."""
    if device.type == "cpu":
        return 64
    wide = 32 if int4 else 64  # an int4 tile of 64 outputs spills on sm_90 (docs/gpu-kernels.md)
    return 16 if n <= 8192 else 32 if n <= 32768 else wide


@triton.jit(do_not_specialize=["M"])  # one binary for every width (above)
def _linear(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, HAS_BIAS: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        w = tl.load(w_ptr + cols[:, None] * K + kk[None, :],
                    mask=(cols[:, None] < N) & (kk[None, :] < K), other=0.0)
        x = tl.load(x_ptr + rows[:, None] * K + kk[None, :],
                    mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
        acc = tl.dot(x.to(w.dtype), tl.trans(w), acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit(do_not_specialize=["M"])  # one binary for every width (above)
def _linear_int4(x_ptr, q_ptr, sz_ptr, b_ptr, out_ptr, M, N, K, HAS_BIAS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """q_ptr: int32 [N, K / 8], input 8j + i in nibble i of word j; sz_ptr: [N, K / GROUP, 2]
    scale and zero (output-major, so that a slice of outputs is a view). Each step
    dequantizes one group of the weight tile in registers."""
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, GROUP)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, GROUP):
        kk = k0 + ks
        words = tl.load(q_ptr + cols[:, None] * (K // 8) + kk[None, :] // 8,
                        mask=cols[:, None] < N, other=0)
        q = (words >> ((kk[None, :] % 8) * 4)) & 0xF
        at = sz_ptr + cols * (K // GROUP) * 2 + (k0 // GROUP) * 2
        scale = tl.load(at, mask=cols < N, other=0.0).to(tl.float32)
        zero = tl.load(at + 1, mask=cols < N, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + rows[:, None] * K + kk[None, :], mask=rows[:, None] < M, other=0.0)
        w = ((q.to(tl.float32) - 8.0) * scale[:, None] + zero[:, None]).to(x.dtype)
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def linear(x: Tensor, w, bias: Tensor | None, n: int, int4: bool,
           scales_and_zeros: Tensor | None) -> Tensor:
    m, k = x.shape
    x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    bn = block_n(n, x.device, int4)
    grid = (triton.cdiv(n, bn), triton.cdiv(m, BLOCK_M))
    b = bias if bias is not None else out  # any pointer: not read without a bias
    if int4:
        _linear_int4[grid](x, w, scales_and_zeros, b, out, m, n, k, bias is not None,
                           BLOCK_M, bn, GROUP)
    else:
        _linear[grid](x, w, b, out, m, n, k, bias is not None, BLOCK_M, bn, BLOCK_K)
    return out


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
def _attend_chunk(q_ptr, kv_ptr, pos_ptr, tree_ptr, acc_ptr, max_ptr, sum_ptr, M, C, scale,
                  HQ: tl.constexpr, HKV: tl.constexpr, GROUPS: tl.constexpr, GP: tl.constexpr,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                  CHUNK: tl.constexpr, BLOCK_KV: tl.constexpr, TREE: tl.constexpr,
                  TW: tl.constexpr):
    """One program per (key/value head, chunk of CHUNK slots, tile of rows): the tile holds
    BLOCK_M rows times the GROUPS query heads sharing the key/value head (padded to GP), and
    leaves each row's running max, sum and unnormalised output over the chunk.

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


@triton.jit(do_not_specialize=["M"])  # one binary for every width (above)
def _attend_combine(acc_ptr, max_ptr, sum_ptr, out_ptr, pos_ptr, M, HQ: tl.constexpr,
                    HKV: tl.constexpr, GROUPS: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                    BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_C: tl.constexpr):
    """One program per (row, key/value head), for its query heads: the chunks merged in slot
    order, BLOCK_C at a time (a fixed block: its sums' order never depends on the number of
    chunks). A chunk past the row's own position, or past the pass's, weighs exactly 0 (max
    -inf, sum 0), which leaves every sum's bits as they were."""
    row, h = tl.program_id(0), tl.program_id(1)
    g = tl.arange(0, GP)
    d = tl.arange(0, BLOCK_D)
    run_max = tl.full((GP,), float("-inf"), tl.float32)
    run_sum = tl.zeros((GP,), tl.float32)
    acc = tl.zeros((GP, BLOCK_D), tl.float32)
    chunks = (tl.load(pos_ptr) + M + CHUNK - 1) // CHUNK
    for c0 in range(0, chunks, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        seen = (c < chunks)[:, None]
        at = (c[:, None] * HKV + h) * M * GP + row * GP + g[None, :]  # [BLOCK_C, GP]
        c_max = tl.load(max_ptr + at, mask=seen, other=float("-inf"))
        new_max = tl.maximum(run_max, tl.max(c_max, axis=0))
        weight = tl.where(c_max == float("-inf"), 0.0, tl.exp(c_max - new_max[None, :]))
        a_old = tl.exp(run_max - new_max)  # 0 at the first block; 1 where nothing new was seen
        c_sum = tl.load(sum_ptr + at, mask=seen, other=0.0)
        run_sum = run_sum * a_old + tl.sum(c_sum * weight, axis=0)
        c_acc = tl.load(acc_ptr + at[:, :, None] * BLOCK_D + d[None, None, :],
                        mask=seen[:, :, None], other=0.0)
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
    _attend_chunk[(hkv, chunks, triton.cdiv(m, BLOCK_M))](
        q.contiguous(), kv, pos, pos if tree is None else tree, acc, run_max, run_sum, m,
        capacity, scale, hq, hkv, groups, gp, d, bd, BLOCK_M, chunk, block_kv,
        tree is not None, 1 if tree is None else tree.shape[1],
        num_warps=8 if BLOCK_M * gp >= 64 else 4)
    _attend_combine[(m, hkv)](acc, run_max, run_sum, out, pos, m, hq, hkv, groups, gp, d, bd,
                              chunk, BLOCK_C, num_warps=16 if gp >= 8 else 8 if gp >= 4 else 4)
    return out
