"""specgen's Triton kernels (kernels/gpu): each op against its PyTorch definition, and the
rule they exist for: a row's result does not depend on how many rows the call has. Without a
GPU they run in Triton's interpreter on the CPU (conftest.py turns it on) in fp32 and fp16
(the interpreter's bf16 is unreliable); on a GPU in bf16 too."""

from __future__ import annotations

import os

import pytest
import torch

from specgen.kernels import gpu
from specgen.kernels.gpu import reference
from specgen.kernels.quantize import quantize_int4

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
pytestmark = pytest.mark.skipif(not gpu.available(DEVICE), reason="Triton cannot run here")


def tol(dtype: torch.dtype) -> dict:
    return {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
            torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}[dtype]


def at(*values: int) -> torch.Tensor:
    """A position as the kernels take it: int64 [1] on the device."""
    return torch.tensor(values, device=DEVICE)

WIDTHS = (1, 3, 16, 17)  # one tile, part of one, a full one, and a second tile


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


def assert_rows_alone(call, rows: torch.Tensor) -> None:
    """Row r of call(rows[:m]) equals row r of call(rows[r:r+1]) and of every other width."""
    full = call(rows)
    for m in WIDTHS:
        assert torch.equal(call(rows[:m]), full[:m])
    for r in (0, 5, len(rows) - 1):
        assert torch.equal(call(rows[r:r + 1])[0], full[r])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_dense(dtype, bias):
    x, w = randn(17, 160, dtype=dtype), randn(48, 160, seed=1, dtype=dtype) / 8
    b = randn(48, seed=2, dtype=dtype) if bias else None
    weight = gpu.Weight.dense(w, b)
    torch.testing.assert_close(gpu.linear(x, weight), reference.linear(x, w, b), **tol(dtype))
    assert_rows_alone(lambda rows: gpu.linear(rows, weight), x)


def test_linear_int4_against_the_dequantized_weight():
    x, w = randn(17, 256), randn(40, 256, seed=1)
    q, sz = quantize_int4(w, gpu.GROUP)
    weight = gpu.Weight.int4(q, sz, randn(40, seed=3))
    assert torch.equal(gpu.unpack_int4(weight.data), q)
    # the kernel's sums carry q + 128 before the offset cancels (tiles._int4_tile): fp32's
    # rounding of sums that much larger
    torch.testing.assert_close(gpu.linear(x, weight), reference.linear_int4(x, q, sz, weight.bias),
                               atol=2e-3, rtol=1e-4)
    assert_rows_alone(lambda rows: gpu.linear(rows, weight), x)


@pytest.mark.parametrize("int4", [False, True])
def test_linear_rows_alone_across_row_tiles_and_k_parts(int4):
    """A program loops over three row tiles (48 rows) and K is split in parts (on this CPU
    `splits` counts 2 SMs, so these small shapes split too): a row's bits are the same in a
    pass of any width, one tile, three, or a second group of 48."""
    from specgen.kernels.gpu import tiles

    x, w = randn(50, 384), randn(40, 384, seed=1)
    weight = gpu.Weight.quantize(w, randn(40, seed=2)) if int4 else gpu.Weight.dense(w, randn(40, seed=2))
    assert tiles.splits(40, 384, tiles.block_n(40, x.device, int4), 128,
                        tiles.sm_count(x.device)) == 3
    full = gpu.linear(x, weight)
    for m in (1, 16, 17, 33, 48, 49):
        assert torch.equal(gpu.linear(x[:m], weight), full[:m]), m
    for r in (0, 20, 47, 48, 49):
        assert torch.equal(gpu.linear(x[r:r + 1], weight)[0], full[r]), r
    if int4:
        q, sz = quantize_int4(w, gpu.GROUP)
        ref = reference.linear_int4(x, q, sz, weight.bias)
    else:
        ref = reference.linear(x, w, weight.bias)
    torch.testing.assert_close(full, ref, atol=2e-3 if int4 else 1e-4, rtol=1e-5)


def test_int4_unpacks_exactly_in_half_precision():
    """fp16 takes the exponent trick two weights a register (bf16 the same on a GPU): the
    product with one-hot rows gives back (q - 8) * scale + zero, every weight exactly."""
    w = randn(48, 256, seed=7)
    weight = gpu.Weight.quantize(w)
    q, sz = quantize_int4(w, gpu.GROUP)
    weight.scales_and_zeros = torch.ones_like(weight.scales_and_zeros)  # scale 1, zero 1
    eye = torch.eye(256, device=DEVICE, dtype=torch.float16)
    got = gpu.linear(eye, weight).T.float()  # [48, 256]: w[n, k] = (q - 8) + 1
    assert torch.equal(got, q.float() - 7)


def test_pack_int4_pairs_inputs_in_register_halves():
    q = torch.arange(16, dtype=torch.int32).repeat(2)[None, :16].repeat(2, 1)
    word = gpu.pack_int4(q)[0, 0].item() & 0xFFFFFFFF
    assert word & 0x000F000F == (0 | 1 << 16) and (word >> 4) & 0x000F000F == (2 | 3 << 16)
    assert torch.equal(gpu.unpack_int4(gpu.pack_int4(q)), q)


def test_an_int4_gpu_layer_gives_its_own_values():
    """Weight.from_linear reads an Int4Linear's values back through tinygemm (here its CPU
    twin) exactly: the same q and scales as quantizing the float weight."""
    from specgen.kernels.cuda_int4 import Int4Linear

    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    layer = Int4Linear.from_weight(w)
    q, sz = quantize_int4(w, gpu.GROUP)
    assert torch.equal(layer.int4_values(rows=96), q)  # chunks of rows that do not divide K
    weight = gpu.Weight.from_linear(layer)
    assert torch.equal(gpu.unpack_int4(weight.data), q)
    assert torch.equal(weight.scales_and_zeros.float(), sz.transpose(0, 1).float())


def test_concatenated_weights_are_one_gemm_of_the_parts():
    x = randn(4, 128)
    a, b = randn(32, 128, seed=1), randn(16, 128, seed=2)
    dense = gpu.Weight.concat([gpu.Weight.dense(a, randn(32, seed=3)), gpu.Weight.dense(b)])
    assert dense.n == 48 and dense.bias[32:].eq(0).all()
    torch.testing.assert_close(gpu.linear(x, dense), reference.linear(x, torch.cat([a, b]), dense.bias))
    quant = gpu.Weight.concat([gpu.Weight.quantize(a), gpu.Weight.quantize(b)])
    parts = [gpu.linear(x, gpu.Weight.quantize(t)) for t in (a, b)]
    assert torch.equal(gpu.linear(x, quant), torch.cat(parts, 1))
    assert torch.equal(gpu.linear(x, quant.rows(32, 48)), parts[1])  # a slice: views


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm(dtype):
    x, r, w = randn(17, 96, dtype=dtype), randn(17, 96, seed=1, dtype=dtype), randn(96, seed=2, dtype=dtype)
    for residual in (r, None):
        normed, summed = gpu.add_rms_norm(x, residual, w, 1e-6)
        ref_normed, ref_summed = reference.add_rms_norm(x, residual, w, 1e-6)
        assert torch.equal(summed, ref_summed)
        torch.testing.assert_close(normed, ref_normed, **tol(dtype))
        if dtype == torch.float32:
            assert_rows_alone(lambda rows: torch.cat(gpu.add_rms_norm(
                rows, None if residual is None else rows * 0.5, w, 1e-6), 1), x)


@pytest.mark.parametrize("with_residual, int4", [(True, False), (False, False), (True, True)])
def test_the_norm_in_the_linears_loads(with_residual, int4):
    """norm_linear: RMSNorm(x + residual) * weight in a dense or int4 linear's loads, every
    part of the split K normalising a row by the same scale: the sum x + residual bit for
    bit, the output as reference.norm_linear, each row's bits the same in a pass of any
    width."""
    from specgen.kernels.gpu import tiles

    x, r = randn(50, 384), randn(50, 384, seed=1)
    nw, w, b = randn(384, seed=2), randn(40, 384, seed=3), randn(40, seed=4)
    assert tiles.splits(40, 384, tiles.block_n(40, x.device, int4), 128,
                        tiles.sm_count(x.device)) > 1
    residual = r if with_residual else None
    weight = gpu.Weight.quantize(w, b) if int4 else gpu.Weight.dense(w, b)
    out, summed = gpu.norm_linear(x, residual, nw, 1e-6, weight)
    ref_h = reference.norm_linear(x, residual, nw, 1e-6, torch.eye(384, device=DEVICE))[0]
    ref_out, ref_summed = reference.norm_linear(x, residual, nw, 1e-6, w, b)
    if int4:
        q, sz = quantize_int4(w, 128)
        ref_out = reference.linear_int4(ref_h, q, sz, b)
    assert torch.equal(summed, ref_summed)
    torch.testing.assert_close(out, ref_out, atol=2e-3 if int4 else 1e-4, rtol=1e-4)
    h, _ = gpu.add_rms_norm(x, residual, nw, 1e-6)  # the two kernels it replaces
    torch.testing.assert_close(out, gpu.linear(h, weight), atol=1e-4, rtol=1e-4)
    for m in (1, 16, 17, 33, 48, 49):
        got, s = gpu.norm_linear(x[:m], None if residual is None else r[:m], nw, 1e-6, weight)
        assert torch.equal(got, out[:m]) and torch.equal(s, summed[:m]), m
    for i in (0, 20, 49):
        one, _ = gpu.norm_linear(x[i:i + 1], None if residual is None else r[i:i + 1], nw,
                                 1e-6, weight)
        assert torch.equal(one[0], out[i]), i


@pytest.mark.parametrize("int4", [False, True])
def test_the_gate_up_projection_computes_silu_in_its_epilogue(int4):
    """linear(x, gate_up, silu=True): each tile loads the gate and the up rows of the same
    outputs and stores silu(gate) * up, with K split: the bits of linear then silu_mul, and
    each row's the same in a pass of any width."""
    from specgen.kernels.gpu import tiles

    x, w, b = randn(50, 384), randn(80, 384, seed=1), randn(80, seed=2)
    weight = gpu.Weight.quantize(w, b) if int4 else gpu.Weight.dense(w, b)
    assert tiles.splits(80, 384, tiles.block_n(80, x.device, int4), 128,
                        tiles.sm_count(x.device)) > 1
    out = gpu.linear(x, weight, silu=True)
    assert out.shape == (50, 40)
    assert torch.equal(out, gpu.silu_mul(gpu.linear(x, weight)))
    for m in (1, 16, 17, 33, 48):
        assert torch.equal(gpu.linear(x[:m], weight, silu=True), out[:m]), m
    assert torch.equal(gpu.linear(x[20:21], weight, silu=True)[0], out[20])


def rope_tables(capacity: int, d: int):
    angles = torch.arange(capacity)[:, None] * 0.5 ** torch.arange(d // 2)[None, :]
    angles = torch.cat([angles, angles], 1)
    return angles.cos().to(DEVICE), angles.sin().to(DEVICE)


def test_rope_write_rotates_and_writes_the_cache():
    hq, hkv, d, capacity = 4, 2, 16, 64
    cos, sin = rope_tables(capacity, d)
    qkv = randn(17, (hq + 2 * hkv) * d)
    kv, ref_kv = randn(2, hkv, capacity, d, seed=4), randn(2, hkv, capacity, d, seed=4)
    q = gpu.rope_write(qkv, cos, sin, kv, at(9), hq, hkv)
    ref_q = reference.rope_write(qkv, cos, sin, ref_kv, 9, hq, hkv)
    torch.testing.assert_close(q, ref_q, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(kv, ref_kv, atol=1e-6, rtol=1e-6)  # slots 9..25 written, the rest kept

    def one_pass(rows: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        cache = torch.zeros(2, hkv, capacity, d, device=DEVICE)
        out = gpu.rope_write(rows, cos, sin, cache, at(start), hq, hkv)
        return out, cache[:, :, start:start + len(rows)]

    full_q, full_kv = one_pass(qkv, 9)
    for m in WIDTHS:  # row r: the same bits wherever its pass starts, whatever its width
        assert torch.equal(one_pass(qkv[:m], 9)[0], full_q[:m])
    for r in (0, 6, 16):
        q_r, kv_r = one_pass(qkv[r:r + 1], 9 + r)
        assert torch.equal(q_r[0], full_q[r]) and torch.equal(kv_r[:, :, 0], full_kv[:, :, r])


@pytest.mark.parametrize("int4, tree", [(False, False), (True, False), (False, True)])
def test_the_qkv_projection_rotates_and_writes_the_cache_in_its_epilogue(int4, tree):
    """norm_linear(..., qkv, rope=Rope(...)): each tile loads the rows of both halves of the
    same heads' inputs and its epilogue (split-K's last program) does rope_write's work:
    the bits of norm_linear then rope_write (q, and every slot of the cache), and each row's
    the same in a pass of any width, written at its slot, rotated at its position (a tree's
    row: at its depth's)."""
    from specgen.kernels.gpu import tiles

    hq, hkv, d, capacity, k = 2, 1, 32, 64, 256
    n = (hq + 2 * hkv) * d
    cos, sin = rope_tables(capacity, d)
    rows = len(TREE) if tree else 33
    x, r, nw = randn(rows, k, seed=1), randn(rows, k, seed=2), randn(k, seed=3)
    w, b = randn(n, k, seed=4) / 8, randn(n, seed=5)
    weight = gpu.Weight.quantize(w, b) if int4 else gpu.Weight.dense(w, b)
    assert tiles.splits(n, k, tiles.block_n(n, x.device, int4), 128,
                        tiles.sm_count(x.device)) > 1
    table = gpu.tree_table(TREE, 16).to(DEVICE) if tree else None
    depths = [len(branch(TREE, i)) - 1 for i in range(rows)] if tree else list(range(rows))

    def fused(m: int, start: int, first: int = 0, shape=table):
        cache = randn(2, hkv, capacity, d, seed=6)
        rope = gpu.Rope(cos, sin, cache, at(start), hq, hkv, shape)
        q, _ = gpu.norm_linear(x[first:first + m], r[first:first + m], nw, 1e-6, weight,
                               rope=rope)
        return q, cache

    q, cache = fused(rows, 9)
    qkv, _ = gpu.norm_linear(x, r, nw, 1e-6, weight)  # the two kernels it replaces
    ref_cache = randn(2, hkv, capacity, d, seed=6)
    assert torch.equal(q, gpu.rope_write(qkv, cos, sin, ref_cache, at(9), hq, hkv, table))
    assert torch.equal(cache, ref_cache)
    for m in (1, 3, 16, 17, 32):  # a wider pass (a tree's: more of its nodes) changes no row
        if m <= rows:
            got, got_cache = fused(m, 9)
            assert torch.equal(got, q[:m]), m
            assert torch.equal(got_cache[:, :, 9:9 + m], cache[:, :, 9:9 + m]), m
    for i in (0, 5, rows - 1):  # a one-row pass at the row's position: its bits
        one, one_cache = fused(1, 9 + depths[i], i, None)
        assert torch.equal(one[0], q[i]), i
        assert torch.equal(one_cache[:, :, 9 + depths[i]], cache[:, :, 9 + i]), i


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    gate_up = randn(17, 2 * 80, dtype=dtype) * 3
    torch.testing.assert_close(gpu.silu_mul(gate_up), reference.silu_mul(gate_up), **tol(dtype))
    assert_rows_alone(gpu.silu_mul, gate_up)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("int4", [False, True])
def test_the_down_projection_computes_silu_in_its_loads(dtype, int4):
    """linear(gate_up, w, gated=True) is bit for bit linear(silu_mul(gate_up), w): the MLP's
    SiLU kernel folded into the down projection's loads, its rounding kept."""
    gate_up = randn(33, 2 * 256, seed=3, dtype=dtype) * 3
    w = randn(40, 256, seed=4)
    weight = gpu.Weight.quantize(w) if int4 else gpu.Weight.dense(w.to(dtype))
    fused = gpu.linear(gate_up, weight, gated=True)
    assert torch.equal(fused, gpu.linear(gpu.silu_mul(gate_up), weight))
    assert torch.equal(gpu.linear(gate_up[20:21], weight, gated=True)[0], fused[20])


BLOCKS = dict(chunk=32, block_kv=16)  # several chunks and blocks in a small cache


@pytest.mark.parametrize("hq, hkv, d", [(4, 2, 16), (6, 2, 24)])
def test_attention(hq, hkv, d):
    capacity = 640
    kv = randn(2, hkv, capacity, d, seed=1)
    q = randn(17, hq, d)
    for start in (0, 40, 600):  # 600: 19 chunks, merged in two blocks
        out = gpu.attention(q, kv, at(start), 0.3, **BLOCKS)
        torch.testing.assert_close(out, reference.attention(q, kv, start, 0.3), atol=2e-6, rtol=1e-5)


def test_attention_rows_alone_across_chunks():
    """Row r of a pass at pos equals a one-row pass at pos + r, and the same rows of every
    width: passes that end in another chunk, or span two, or another block of merged chunks,
    leave each row's bits alone."""
    hq, hkv, d, capacity = 4, 2, 16, 544
    kv = randn(2, hkv, capacity, d, seed=2)
    q = randn(17, hq, d, seed=3)
    for start in (27, 505):  # 27..43: chunks 0 and 1; 505..521: chunk blocks 0 and 1
        full = gpu.attention(q, kv, at(start), 0.25, **BLOCKS)
        for m in WIDTHS:
            assert torch.equal(gpu.attention(q[:m], kv, at(start), 0.25, **BLOCKS), full[:m])
        for r in (0, 4, 5, 16):
            one = gpu.attention(q[r:r + 1], kv, at(start + r), 0.25, **BLOCKS)
            assert torch.equal(one[0], full[r])


# A token tree in preorder (core/tree.py): the chain 1..4 from the root, and branches off
# nodes 2, 1 (two deep) and the root (two deep); depths 0 1 2 3 4 3 2 3 1 2.
TREE = (-1, 0, 1, 2, 3, 2, 1, 6, 0, 8)


def branch(parents, row: int) -> list[int]:
    """Row `row`'s ancestors from the root, itself last."""
    nodes = [row]
    while parents[nodes[0]] >= 0:
        nodes.insert(0, parents[nodes[0]])
    return nodes


def test_tree_table():
    table = gpu.tree_table(TREE, 16)
    assert table.shape == (16, 17) and table.dtype == torch.int32
    assert table[7].tolist()[:5] == [3, 0, 1, 6, 7] and set(table[7].tolist()[5:]) == {-1}
    assert table[0].tolist()[:2] == [0, 0] and (table[len(TREE):] == -1).all()


def test_rope_write_rotates_a_tree_at_its_depths():
    hq, hkv, d, capacity = 4, 2, 16, 64
    cos, sin = rope_tables(capacity, d)
    qkv = randn(len(TREE), (hq + 2 * hkv) * d)
    kv, ref_kv = randn(2, hkv, capacity, d, seed=4), randn(2, hkv, capacity, d, seed=4)
    tree = gpu.tree_table(TREE, 16).to(DEVICE)
    q = gpu.rope_write(qkv, cos, sin, kv, at(9), hq, hkv, tree)
    depths = [len(branch(TREE, r)) - 1 for r in range(len(TREE))]
    ref_q = reference.rope_write(qkv, cos, sin, ref_kv, 9, hq, hkv, depths)
    torch.testing.assert_close(q, ref_q, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(kv, ref_kv, atol=1e-6, rtol=1e-6)
    for r in (4, 5, 9):  # each row: the bits of a one-row pass at its depth's position
        cache = torch.zeros(2, hkv, capacity, d, device=DEVICE)
        one = gpu.rope_write(qkv[r:r + 1], cos, sin, cache, at(9 + depths[r]), hq, hkv)
        assert torch.equal(one[0], q[r]) and torch.equal(cache[:, :, 9 + depths[r]], kv[:, :, 9 + r])


@pytest.mark.parametrize("start", [27, 505])  # tree across chunks 0 and 1; across chunk blocks
def test_tree_attention_rows_are_one_token_passes_along_their_branch(start):
    """Row r of a tree's pass equals, bit for bit, a one-row pass at its depth's position over
    a cache that holds its branch in order (what a one-token pass along the branch sees), and
    the tree's first branch is the chain's pass."""
    hq, hkv, d, capacity = 4, 2, 16, 544
    kv = randn(2, hkv, capacity, d, seed=5)
    q = randn(len(TREE), hq, d, seed=6)
    tree = gpu.tree_table(TREE, 16).to(DEVICE)
    out = gpu.attention(q, kv, at(start), 0.25, tree=tree, **BLOCKS)
    torch.testing.assert_close(out, reference.attention(q, kv, start, 0.25, list(TREE)),
                               atol=2e-6, rtol=1e-5)
    chain = gpu.attention(q[:5], kv, at(start), 0.25, **BLOCKS)
    assert torch.equal(out[:5], chain)
    for r in range(len(TREE)):
        nodes = branch(TREE, r)
        along = kv.clone()
        along[:, :, start:start + len(nodes)] = kv[:, :, [start + a for a in nodes]]
        one = gpu.attention(q[r:r + 1], along, at(start + len(nodes) - 1), 0.25, **BLOCKS)
        assert torch.equal(one[0], out[r]), r


def test_available_only_where_the_kernels_run(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert gpu.available("cpu")
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not gpu.available("cpu")
    monkeypatch.setattr(gpu.importlib.util, "find_spec", lambda name: None)
    assert not gpu.available("cuda")


OFFLINE = """
import json, sys
sys.path.insert(0, "bench")
import gpu_kernels
from specgen.decoding import fused_offline as offline

shape = gpu_kernels.shapes()["llama-3.1-8b"]
widths = {}  # (op, kernel): the binaries of passes of 1..33 rows
per_layer = {}  # "int4/tree": the kernels of one layer, from the decoder's launch list
for int4 in (False, True):
    for tree in (False, True):
        seen = {}
        for m in range(1, 34):
            launches = offline.launches(shape, m, int4, tree)
            counts = per_layer.setdefault(f"{int4}/{tree}", set())
            counts.add(sum(1 for l in launches if l.op not in ("final norm", "head")))
            for launch in launches:
                key = (launch.op, launch.kernel, int4, tree)
                spec = repr((launch.signature, launch.constexprs, launch.attrs))
                if spec not in seen.setdefault(key, {}):
                    seen[key][spec] = offline.measure(launch).hash
        for key, specs in seen.items():
            widths["/".join(map(str, key))] = sorted(set(specs.values()))
rows = gpu_kernels.rows()
per_layer = {k: sorted(v) for k, v in per_layer.items()}
print(json.dumps(dict(rows=rows, widths=widths, per_layer=per_layer,
                      doc=gpu_kernels.render(rows))))
"""


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """Every kernel the fused decoder launches, at the launch configuration it really uses
    (recorded through the decoder's own code at bench/gpu.py's shapes), compiled for sm_90 to
    the end (ptxas) on this CPU, in a process of its own (the interpreter is off there):
    bench/gpu_kernels.py's rows, and the binaries of every width 1..33 of the 8B's."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("this Triton has no NVIDIA backend")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path_factory.mktemp("triton")),
               TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run([sys.executable, "-c", OFFLINE], env=env, capture_output=True,
                         text=True, timeout=900, cwd=root)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


SM90_SHARED = 227 * 1024


def test_every_kernel_fits_hopper_at_its_launch_configuration(offline):
    """No kernel spills a register or needs more shared memory than sm_90 gives a block, at
    each model's shape, in a chain's pass and a tree's."""
    rows = offline["rows"]
    assert {r["model"] for r in rows} == {"0.5B", "1.5B", "1B", "8B", "70B int4"}
    assert {r["kernel"] for r in rows} == {"_add_rms_norm", "_linear", "_linear_int4",
                                           "_attend_chunk"}
    assert {r["op"] for r in rows if r["kernel"] == "_add_rms_norm"} == {"final norm"}
    for r in rows:
        where = f"{r['model']} {r['op']} ({r['kernel']})"
        assert r["spills"] == 0 and r["stack"] == 0, where
        assert r["shared"] <= SM90_SHARED, where
        assert 0 < r["regs"] <= 255, where


def test_every_linear_gives_every_sm_two_programs(offline):
    """Split-K: each linear of the 0.5B, 1.5B, 8B and 70B shapes (and the 1B draft) launches
    at least two programs per SM of an H100 or H200 (132), so that a one-token pass streams
    its weights from every SM; the parts come from N, K and the SM count alone."""
    linears = [r for r in offline["rows"] if r["kernel"].startswith("_linear")]
    assert {r["op"] for r in linears} == {"qkv", "o", "gate_up", "down", "head", "qkv (tree)"}
    for r in linears:
        assert r["ctas"] >= 2 * 132, (r["model"], r["op"], r["ctas"])
        assert r["grid"][2] == 1  # a 33-row pass: one group of row tiles, looped in a program


def test_int4_dequantization_instructions_per_weight(offline):
    """The int4 linear's main loop, read from its cubin: instructions a thread issues per
    weight it streams. At most 2.5 for a pass of one row tile (the issue's aim), in every
    int4 linear: q/k/v and gate/up normalise their inputs before the loop, so their loop is
    o's (docs/gpu-kernels.md gives the figures); the whole loop (three row tiles) is kept
    from growing."""
    rows = [r for r in offline["rows"] if r["kernel"] == "_linear_int4"]
    assert len(rows) == 5  # q/k/v in a chain's pass and a tree's, o, gate/up, down
    for r in rows:
        one_tile, all_tiles = r["per_weight"]
        assert one_tile <= 2.5, (r["op"], one_tile)
        assert all_tiles <= 3.8, (r["op"], all_tiles)


def test_the_kernel_table_is_the_scripts_output(offline):
    """docs/gpu-kernels.md is bench/gpu_kernels.py's output for this code, not hand-kept."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "gpu-kernels.md")) as f:
        assert f.read() == offline["doc"], "run: python bench/gpu_kernels.py --doc docs/gpu-kernels.md"


def test_one_binary_per_kernel_for_every_width(offline):
    """A pass of 1..33 rows runs the same compiled kernel (one hash) for each of its
    launches: the rows' count is not specialized (M = 1 a constant, M = 16, 32 aligned)."""
    widths = offline["widths"]
    assert any(k.startswith("qkv/_linear_int4") for k in widths)
    assert any(k.startswith("attention/_attend_chunk") and k.endswith("True") for k in widths)
    for key, hashes in widths.items():
        assert len(hashes) == 1, (key, hashes)


KERNELS_PER_LAYER = {"False/False": 5, "False/True": 5,  # bf16: chain, tree
                     "True/False": 5, "True/True": 5}  # int4: chain, tree


def test_kernels_per_layer_from_the_decoders_launch_list(offline):
    """One layer of the 8B's shape, as `layer_pass` launches it for a pass of every width
    1..33: five kernels in bf16 and in int4, chain and tree passes alike (the attention
    merge runs in the attention kernel's last program; a q/k/v or gate/up linear computes
    the RMSNorm before it in its loads; the q/k/v linear the rotation and the cache write
    after it in its epilogue; an int4 gate/up linear, the SiLU in its epilogue)."""
    assert offline["per_layer"] == {k: [v] for k, v in KERNELS_PER_LAYER.items()}


def test_the_pass_model_counts_the_decoders_launches(tmp_path):
    """bench/gpu_model.py: a one-token pass predicted from bytes, kernels (the decoder's own
    launch list: five a layer in bf16, then the final norm and the head) and bandwidth; the H200's
    floor below the H100's by their bandwidths' ratio."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("this Triton has no NVIDIA backend")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "rows.json"
    run = subprocess.run([sys.executable, "bench/gpu_model.py", "--json", str(out)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=root)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {r["model"]: r for r in json.loads(out.read_text())}
    assert rows["8B"]["kernels"] == 32 * 5 + 2 and rows["8B"]["kernels_per_layer"] == 5
    assert 15e9 < rows["8B"]["weights"] < 16.2e9  # 8.03B parameters in bf16, less the embedding
    for r in rows.values():
        assert r["H200_floor_ms"] == pytest.approx(r["H100_floor_ms"] * 3.35 / 4.8)
        assert r["H100_ms"] > r["H100_floor_ms"]
