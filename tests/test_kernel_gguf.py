"""gguf.c: GGUF's block formats computed from their bytes as stored. Each format against a
float64 reference (gguf's own dequantizer, int8 activations); dequantize gives gguf's values
exactly; each row of a pass of any width has the bits of a one-row pass; AVX2, AVX512-VNNI and
the AMX tiles (the wide passes) give the same bits; 1 and 2 threads too."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

gguf_lib = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402

from specgen.errors import ConfigError, ResourceError  # noqa: E402
from specgen.kernels import gguf  # noqa: E402
from specgen.kernels.linear import FP32_ROWS  # noqa: E402

try:
    BEST = gguf.best_path()
except ResourceError:  # no AVX2, no C compiler
    BEST = None
needs_kernel = pytest.mark.skipif(BEST is None, reason="no AVX2 or no C compiler here")
needs_vnni = pytest.mark.skipif(BEST is None or BEST < gguf.VNNI,
                                reason="this CPU has no AVX512-VNNI")
needs_amx = pytest.mark.skipif(BEST != gguf.AMX, reason="this CPU (or its OS) gives no AMX tiles")

BLOCKS = ["Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
# where each block keeps its fp16 scales (d, and dmin for Q4_K/Q5_K)
HALVES = {"Q4_0": [0], "Q5_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")


def blocks(kind: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """n rows of k weights of `kind` as a GGUF file stores them: every quant, scale, min and
    high bit random (all values the format can hold, Q8_0's -128 included), and the fp16
    scales finite."""
    fmt = gguf.FORMATS[kind]
    rng = np.random.default_rng(seed)
    nb = k // fmt.block_weights
    raw = rng.integers(0, 256, (n, nb, fmt.block_bytes), dtype=np.uint8)
    for at in HALVES[kind]:
        half = (rng.standard_normal((n, nb)) * 0.01).astype(np.float16)
        raw[:, :, at:at + 2] = half.view(np.uint8).reshape(n, nb, 2)
    return raw.reshape(n, -1)


def weight(kind: str, n: int, k: int, seed: int = 0) -> tuple[gguf.GGUFWeight, np.ndarray]:
    raw = blocks(kind, n, k, seed)
    return gguf.wrap(kind, raw, n, k), raw


def small_k(kind: str) -> int:
    return 512 if kind in K_QUANTS else 96  # 2 super-blocks; 3 blocks (an odd last pair)


def int8_reference(x: torch.Tensor, w: np.ndarray, kind: str) -> torch.Tensor:
    """x @ W.T in float64 with x quantized as the kernel quantizes it (float32 scale per block
    of 32 or super-block of 256, rounded to nearest even), W by gguf's dequantizer."""
    group = 256 if kind in K_QUANTS else 32
    m, k = x.shape
    g = x.reshape(m, k // group, group)
    e = g.abs().amax(-1) / 127
    inv = torch.where(e > 0, 1 / e, torch.zeros_like(e))
    a = torch.round(g * inv[..., None])  # float32 product, ties to even: the kernel's
    xq = (a.double() * e.double()[..., None]).reshape(m, k)
    return xq @ torch.from_numpy(w).double().T


@needs_kernel
@pytest.mark.parametrize("kind", BLOCKS)
def test_dequantize_gives_ggufs_values(kind):
    w, raw = weight(kind, 21, small_k(kind))
    want = gguf_dequantize(raw, GGMLQuantizationType[kind])
    assert np.array_equal(gguf.dequantize(w).numpy(), want)
    rows = torch.tensor([20, 0, 7, 7])
    assert np.array_equal(gguf.dequantize(w, rows).numpy(), want[[20, 0, 7, 7]])


@needs_kernel
@pytest.mark.parametrize("kind", BLOCKS)
@pytest.mark.parametrize("m", [1, 5, 9])
def test_each_format_computes_its_dot_products(kind, m):
    """Against float64 with the same int8 activations: only the float rounding of the scales
    and the summation order may differ. And against the unquantized activations, within the
    error that int8 activations bring."""
    n, k = 37, small_k(kind) * 2
    w, raw = weight(kind, n, k, seed=m)
    deq = gguf_dequantize(raw, GGMLQuantizationType[kind])
    x = torch.randn(m, k) * 2
    bias = torch.randn(n)
    size = torch.from_numpy(np.abs(deq)).double() @ x.double().abs().T  # sum |w| |x|, [n, m]
    want = int8_reference(x, deq, kind) + bias.double()
    for p in gguf.paths():
        got = gguf.linear(x, w, bias, path=p).double()
        assert ((got - want).abs() <= 1e-5 * size.T + 1e-6).all(), kind
        exact = x.double() @ torch.from_numpy(deq).double().T + bias.double()
        assert ((got - exact).abs() <= 0.02 * size.T).all()


@needs_kernel
@pytest.mark.parametrize("kind", BLOCKS)
def test_every_row_of_a_pass_has_its_one_row_bits(kind):
    w, _ = weight(kind, 19, small_k(kind))  # 19 rows: no multiple of anything
    x = torch.randn(FP32_ROWS, w.k) * 3
    bias = torch.randn(19)
    for p in gguf.paths():
        alone = torch.cat([gguf.linear(x[i:i + 1], w, bias, p) for i in range(FP32_ROWS)])
        for m in list(range(2, 34)) + [FP32_ROWS]:
            assert torch.equal(gguf.linear(x[:m], w, bias, p), alone[:m]), (kind, p, m)
        assert torch.equal(gguf.linear(x[11:16], w, bias, p), alone[11:16])


@needs_vnni
@pytest.mark.parametrize("kind,k", [
    ("Q4_0", 96), ("Q4_0", 1536), ("Q5_0", 896), ("Q5_0", 4864), ("Q5_0", 160), ("Q8_0", 896),
    ("Q8_0", 96), ("Q4_K", 1536), ("Q4_K", 256), ("Q5_K", 768), ("Q6_K", 4864), ("Q6_K", 1536)])
def test_vnni_gives_the_avx2_paths_bits(kind, k):
    """Several super-blocks, block counts odd and even (the VNNI path takes blocks in pairs),
    the draft's K = 896 and 4864, and rows not a multiple of the tile."""
    w, _ = weight(kind, 29, k, seed=k)
    x = torch.randn(13, k) * 5
    x[3] = 0  # a row of zeros: scale 0
    x[4, :40] *= 1000  # one block far larger than the rest
    bias = torch.randn(29)
    for m in (1, 2, 4, 5, 8, 9, 13):
        for b in (bias, None):
            assert torch.equal(gguf.linear(x[:m], w, b, gguf.VNNI),
                               gguf.linear(x[:m], w, b, gguf.AVX2)), (kind, m)


@needs_vnni
@pytest.mark.parametrize("kind", K_QUANTS)
def test_long_rows_by_spans_keep_the_one_row_bits(kind):
    """Passes whose tokens' inputs would overflow L1 over a row (the demo's MLP down layer,
    K = 8960: 35 super-blocks, an odd last one) take the rows by spans on VNNI: a narrow pass
    of 5 to 8 tokens, and each whole tile of 8 tokens of a wide pass. Every row keeps a
    one-row pass's bits at every width, on one thread or two; 37 rows (narrow: two blocks of 16
    and 5 more; wide: 32 and 5), a row of zeros and one block far larger than the rest."""
    w, _ = weight(kind, 37, 8960, seed=11)
    x = torch.randn(40, w.k) * 3
    x[2] = 0
    x[6, :40] *= 1000
    x[21, :40] *= 1000
    bias = torch.randn(37)
    alone = torch.cat([gguf.linear(x[i:i + 1], w, bias, gguf.AVX2) for i in range(len(x))])
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for m in [*range(1, 10), 16, 17, 40]:
                assert torch.equal(gguf.linear(x[:m], w, bias, gguf.VNNI), alone[:m]), (kind, m, n)
    finally:
        torch.set_num_threads(threads)


@needs_vnni
@pytest.mark.parametrize("kind", ["Q4_0", "Q5_0"])
def test_unpacking_by_vbmi_gives_the_avx2_paths_bits(kind):
    """Whole sets of 4 blocks unpack by byte permutes where the CPU has VBMI, the rest as
    before: groups of 16 blocks, whole sets short of a group (K = 896: 16 + 12), a part set
    (K = 96, 960) and one set (K = 128)."""
    if not gguf.unpack_by_vbmi(True):
        pytest.skip("this CPU has no AVX512-VBMI")
    try:
        for k in (96, 128, 896, 960, 4864):
            w, _ = weight(kind, 29, k, seed=k)
            x = torch.randn(9, k) * 5
            x[4, :40] *= 1000
            for m in (1, 2, 5, 9):
                avx2 = gguf.linear(x[:m], w, None, gguf.AVX2)
                for use in (True, False):
                    gguf.unpack_by_vbmi(use)
                    assert torch.equal(gguf.linear(x[:m], w, None, gguf.VNNI), avx2), (k, m, use)
    finally:
        gguf.unpack_by_vbmi(None)  # the CPU's default again
    assert gguf.unpack_by_vbmi(None)


# Widths across the token tiles of every path: 8 (AVX2, VNNI), 16 (AMX), their multiples and
# the rows either side (the AMX path takes the passes from amx_rows() = 16 tokens on), and a
# prompt's 136.
WIDE = list(range(1, 34)) + [47, 48, 64, 100, 129, 136]


def takes_the_tiles(kind: str, m: int, p: int) -> bool:
    """Whether a pass of m tokens asked of path p runs on the tiles (and says so)."""
    on = gguf.pass_path(kind, m, p) == gguf.AMX
    assert on == (p == gguf.AMX and m >= gguf.amx_rows()), (kind, m, p)
    return on


@needs_kernel
@pytest.mark.parametrize("kind,k", [(kind, 768) for kind in K_QUANTS]
                         + [("Q4_0", 896), ("Q5_0", 4864), ("Q8_0", 96), ("Q5_0", 160)])
def test_a_wide_pass_gives_each_row_its_one_row_bits(kind, k):
    """Each path's rows against one-row passes on AVX2: 35 weight rows (two tiles of 16 and
    3 more), 3 super-blocks (an odd last one) or 32-blocks by groups of 16 with a part-filled
    last one, a row of zeros and a row with one block far larger than the rest; with and
    without a bias."""
    w, _ = weight(kind, 35, k, seed=3)
    x = torch.randn(max(WIDE), w.k) * 3
    x[7] = 0
    x[20, :50] *= 1000
    for bias in (torch.randn(35), None):
        alone = torch.cat([gguf.linear(x[i:i + 1], w, bias, gguf.AVX2) for i in range(len(x))])
        for p in gguf.paths():
            for m in WIDE:
                takes_the_tiles(kind, m, p)
                assert torch.equal(gguf.linear(x[:m], w, bias, p), alone[:m]), (kind, p, m)
            assert torch.equal(gguf.linear(x[5:45], w, bias, p), alone[5:45]), (kind, p)


@needs_amx
@pytest.mark.parametrize("kind,k", [
    ("Q4_K", 1536), ("Q5_K", 512), ("Q6_K", 8960), ("Q6_K", 256),
    ("Q4_0", 896), ("Q4_0", 96), ("Q5_0", 896), ("Q5_0", 4864), ("Q8_0", 896), ("Q8_0", 4864)])
def test_the_tiles_give_the_vnni_paths_bits(kind, k):
    """The demo target's shapes (the MLP's K = 8960 included) and a single super-block; the
    draft's 32-blocks (K = 896 and 4864 = 152 blocks, not whole groups of 16) and 3 blocks; 37
    weight rows (a last tile of 5); a row of zeros, a row with one block far larger than the
    rest; a last tile of tokens of 1 to 15, and a prompt's 136 tokens."""
    w, _ = weight(kind, 37, k, seed=k)
    x = torch.randn(136, k) * 5
    x[3] = 0
    x[30, :50] *= 1000
    bias = torch.randn(37)
    assert gguf.amx_rows() <= 16  # the widths below take the tiles from there on
    for m in (gguf.amx_rows(), 17, 31, 32, 33, 40, 136):
        assert takes_the_tiles(kind, m, gguf.AMX)
        assert torch.equal(gguf.linear(x[:m], w, bias, gguf.AMX),
                           gguf.linear(x[:m], w, bias, gguf.VNNI)), (kind, m)


@needs_kernel
@pytest.mark.parametrize("kind", ["Q5_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("m", [6, 40])
def test_one_and_two_threads_give_the_same_bits(kind, m):
    w, _ = weight(kind, 301, 1024 if kind in K_QUANTS else 896)
    x = torch.randn(m, w.k)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [gguf.linear(x, w, path=p) for p in gguf.paths()]
        torch.set_num_threads(2)
        two = [gguf.linear(x, w, path=p) for p in gguf.paths()]
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, two):
        assert torch.equal(a, b)


@needs_kernel
@pytest.mark.parametrize("kinds", [("Q4_K", "Q6_K", "Q4_K"), ("Q5_0", "Q8_0", "Q5_0"),
                                   ("Q4_0", "Q4_K"), ("Q8_0",), ("Q4_K",) * 5])
@pytest.mark.parametrize("m", [1, 5, 17])
def test_layers_of_one_input_in_one_call_get_their_own_calls_bits(kinds, m):
    """gguf.Joined (a decoder layer's q/k/v or gate/up as one call): each output is its
    layer's own call's, bit for bit, with or without a bias, on one thread or two, and
    from AMX_ROWS tokens on, or for more layers than one thread region takes (where each
    layer takes a call of its own)."""
    k = 512
    layers = []
    for i, kind in enumerate(kinds):
        w, _ = weight(kind, 37 + 64 * i, k, seed=i)
        layers.append(gguf.GGUFLinear(w, torch.randn(w.n) if i != 1 else None))
    joined = gguf.Joined.of(layers)
    x = torch.randn(m, k)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            got = joined(x)
            assert [tuple(y.shape) for y in got] == [(m, layer.out_features) for layer in layers]
            for y, layer in zip(got, layers):
                assert torch.equal(y, layer(x)), (kinds, m, n)
    finally:
        torch.set_num_threads(threads)


def test_only_block_layers_of_one_input_width_are_joined():
    q4, _ = weight("Q4_K", 8, 512)
    wide, _ = weight("Q4_K", 8, 768)
    floats = gguf.wrap("F32", np.zeros((8, 512), np.float32), 8, 512)
    assert gguf.Joined.of([gguf.GGUFLinear(q4), gguf.GGUFLinear(floats)]) is None
    assert gguf.Joined.of([gguf.GGUFLinear(q4), gguf.GGUFLinear(wide)]) is None
    assert gguf.Joined.of([]) is None
    assert gguf.Joined.of([gguf.GGUFLinear(q4), gguf.GGUFLinear(q4)]) is not None


@needs_kernel
@pytest.mark.parametrize("kind", ["Q4_0", "Q5_0", "Q8_0"])
def test_blocks_from_ggufs_own_quantizer(kind):
    """Blocks as gguf (and so llama.cpp) writes them, not only random bytes."""
    n, k = 24, 896
    data = np.random.default_rng(1).standard_normal((n, k)).astype(np.float32)
    raw = gguf_lib.quants.quantize(data, GGMLQuantizationType[kind])
    w = gguf.wrap(kind, raw, n, k)
    deq = gguf_dequantize(raw, GGMLQuantizationType[kind])
    assert np.array_equal(gguf.dequantize(w).numpy(), deq)
    x = torch.randn(3, k)
    got = gguf.linear(x, w).double()
    size = torch.from_numpy(np.abs(deq)).double() @ x.double().abs().T
    assert ((got - int8_reference(x, deq, kind)).abs() <= 1e-5 * size.T + 1e-6).all()


@needs_kernel
def test_a_gguf_files_tensors_are_read_in_place(tmp_path):
    """Through gguf.GGUFReader as a loader uses it: the weight is a view of the file's
    read-only map (no copy, no warning), and computes what gguf's dequantizer says."""
    writer = gguf_lib.GGUFWriter(tmp_path / "t.gguf", "test")
    shapes = {"q4k": ("Q4_K", 40, 512), "q6k": ("Q6_K", 24, 256), "q5_0": ("Q5_0", 16, 896)}
    for name, (kind, n, k) in shapes.items():
        writer.add_tensor(name, blocks(kind, n, k), raw_dtype=GGMLQuantizationType[kind])
    writer.add_tensor("f32", np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf_lib.GGUFReader(tmp_path / "t.gguf")
    for t in reader.tensors:
        k, n = int(t.shape[0]), int(t.shape[1])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            w = gguf.wrap(t.tensor_type.name, t.data, n, k)
        assert w.data.data_ptr() == t.data.ctypes.data  # the file's own pages
        assert not t.data.flags["WRITEABLE"]
        deq = gguf_dequantize(t.data, t.tensor_type).reshape(n, k)
        assert np.array_equal(gguf.dequantize(w).numpy(), deq)
        x = torch.randn(2, k)
        want = x.double() @ torch.from_numpy(deq).double().T
        size = torch.from_numpy(np.abs(deq)).double() @ x.double().abs().T
        assert ((gguf.linear(x, w).double() - want).abs() <= 0.02 * size.T + 1e-6).all()


@needs_kernel
@pytest.mark.parametrize("kind", ["F32", "F16", "BF16"])
def test_float_tensors(kind):
    data = np.random.default_rng(0).standard_normal((10, 64)).astype(np.float32)
    raw = {"F32": data, "F16": data.astype(np.float16),
           "BF16": gguf_lib.quants.quantize(data, GGMLQuantizationType.BF16)}[kind]
    w = gguf.wrap(kind, raw, 10, 64)
    deq = torch.from_numpy(gguf_dequantize(raw, GGMLQuantizationType[kind]).reshape(10, 64).copy())
    assert torch.equal(gguf.dequantize(w), deq)
    assert torch.equal(gguf.dequantize(w, torch.tensor([3, 1])), deq[[3, 1]])
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    if kind == "BF16":  # bf16 activations on the bf16 kernel, its outputs rounded to bf16
        expected, tol = x.bfloat16().float() @ deq.T, 1e-2
    else:
        expected, tol = x @ deq.T, 1e-4
    assert torch.allclose(gguf.linear(x, w), expected, rtol=tol, atol=tol)
    if kind != "BF16":
        assert torch.equal(gguf.linear(x, w)[1:2], gguf.linear(x[1:2], w))


@needs_kernel
def test_the_layer_keeps_no_copy_of_the_weight():
    w, raw = weight("Q4_K", 16, 256)
    layer = gguf.GGUFLinear(w, torch.randn(16))
    assert list(layer.state_dict()) == [] and list(layer.parameters()) == []
    x = torch.randn(2, 3, 256, dtype=torch.bfloat16)
    y = layer(x)
    assert y.shape == (2, 3, 16) and y.dtype == torch.bfloat16
    want = gguf.linear(x.reshape(6, 256).float(), w, layer.bias).to(torch.bfloat16)
    assert torch.equal(y.reshape(6, 16), want)
    flat = torch.randn(3, 256)  # the lean decoder's rows, called without linear's checks
    assert torch.equal(layer(flat), gguf.linear(flat, w, layer.bias))
    with pytest.raises(ValueError, match="features"):  # never read past the input's end
        layer(torch.randn(3, 128))


def test_an_unknown_type_is_a_config_error_naming_the_supported_ones():
    assert "Q4_K" in gguf.FORMATS and "IQ2_XS" not in gguf.FORMATS
    with pytest.raises(ConfigError, match="Q4_K"):
        gguf.wrap("IQ2_XS", np.zeros((4, 66), np.uint8), 4, 256)
    with pytest.raises(ConfigError, match="whole blocks"):
        gguf.wrap("Q4_K", np.zeros((4, 144), np.uint8), 4, 200)
    with pytest.raises(ConfigError, match="bytes"):
        gguf.wrap("Q4_K", np.zeros((4, 100), np.uint8), 4, 256)


@needs_kernel
def test_a_path_the_cpu_lacks_is_refused():
    w, _ = weight("Q8_0", 4, 32)
    with pytest.raises(ValueError, match="no GGUF kernel path"):
        gguf.linear(torch.ones(1, 32), w, path=7)


def test_every_format_declares_its_block():
    assert {k: (f.block_weights, f.block_bytes) for k, f in gguf.FORMATS.items()
            if k in BLOCKS} == {k: gguf_lib.GGML_QUANT_SIZES[GGMLQuantizationType[k]]
                                for k in BLOCKS}


def test_without_a_compiler_or_avx2_it_says_what_to_do(monkeypatch, tmp_path, fresh_kernels):
    from specgen.kernels import build

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))  # nothing compiled there yet
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(ResourceError, match="needs a C compiler.*apt install gcc.*safetensors"):
        gguf.library()
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    with pytest.raises(ResourceError, match="Compiling the GGUF kernel failed"):
        gguf.library()
    assert not list((tmp_path / "kernels").glob("*.so"))  # no half-built library left
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    with pytest.raises(ResourceError, match="needs an x86 CPU with AVX2.*safetensors"):
        gguf.library()
    w = gguf.wrap("Q4_K", blocks("Q4_K", 2, 256), 2, 256)  # wrapping needs no kernel
    assert w.n == 2


def test_swiglu_is_silu_times_up_with_each_values_bits_its_own():
    """The GGUF MLP's activation: silu(gate) * up to float32's rounding, a value's bits the
    same wherever it stands (a row alone or in a pass of 40, whose rows two threads share; in
    a row's tail or not)."""
    g = torch.randn(40, 37, generator=torch.Generator().manual_seed(0)) * 6
    u = torch.randn(40, 37, generator=torch.Generator().manual_seed(1))
    g[0, :5] = torch.tensor([0.0, -100.0, 100.0, -87.5, 88.5])
    g[:, 36], u[:, 36] = g[:, 3], u[:, 3]  # in the tail of 5 values and in a whole vector
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        got = gguf.swiglu(g, u)
    finally:
        torch.set_num_threads(threads)
    assert torch.allclose(got, torch.nn.functional.silu(g) * u, rtol=1e-6, atol=1e-30)
    assert torch.equal(got, torch.cat([gguf.swiglu(g[i : i + 1], u[i : i + 1]) for i in range(40)]))
    assert torch.equal(got[:, 36], got[:, 3])
