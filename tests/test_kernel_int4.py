"""int4.c's paths: each computes the int4-dyn math (int8 activations, exact integer block
sums); AVX2 and AVX512-VNNI give the same bits, each row's whatever the pass's width; tile
products (AMX, or VNNI registers with AMX's bits) take only passes wider than a verify pass."""

from __future__ import annotations

import pytest
import torch

from specgen.kernels import int4
from specgen.kernels.linear import FP32_ROWS
from specgen.errors import ResourceError
from specgen.choices import MAX_K

try:
    BEST = int4.best_path()
except ResourceError:  # no AVX2, no C compiler
    BEST = None
NAMES = {int4.AVX2: "AVX2", int4.VNNI: "AVX512-VNNI", int4.AMX: "AMX",
         int4.VNNI_TILES: "VNNI-tiles"}
HAS = () if BEST is None else int4.paths()


def path(p: int):
    return pytest.param(p, id=NAMES[p], marks=pytest.mark.skipif(
        p not in HAS, reason=f"this CPU has no {NAMES[p]}"))


PATHS = [path(p) for p in NAMES]
needs_tiles = pytest.mark.skipif(int4.VNNI_TILES not in HAS, reason="this CPU has no AVX512-VNNI")


def layer(o: int, k: int, seed: int = 0):
    torch.manual_seed(seed)
    packed, scales = int4.quantize(torch.randn(o, k))
    return packed, scales, torch.randn(o)


@pytest.mark.parametrize("p", PATHS)
@pytest.mark.parametrize("m", [1, 3, 7, 17, 40])  # AMX: a part, one and three groups of 16
# whole and partial tiles of 16 rows; 21 blocks: a partial quad of blocks and group of 16
@pytest.mark.parametrize("o,k", [(40, 128), (21, 96), (17, 672)])
def test_each_path_computes_the_integer_dot_products(p, m, o, k):
    """Against the same math in float64: int8 activations per token and block, integer
    block sums, scaled; only the float summation order may differ."""
    packed, scales, bias = layer(o, k)
    x = torch.randn(m, k)
    q = torch.cat([packed & 15, packed >> 4], -1).double()  # [o, k / 32, 32] in 0..15
    blocks = x.reshape(m, k // 32, 32)
    e = blocks.abs().amax(-1) / 127
    a = torch.round(blocks / e[..., None]).double()
    d, low = scales.double()
    dots = torch.einsum("obj,tbj->tob", q, a)  # exact integers
    want = (dots * d[None] * e[:, None].double() + low[None] * (e * a.sum(-1))[:, None]).sum(-1)
    got = int4.linear(x, packed, scales, bias, p)
    assert torch.allclose(got.double(), want + bias.double(), rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(BEST is None or BEST < int4.VNNI, reason="this CPU has no AVX512-VNNI")
# block counts: even and odd, partial quads of blocks and groups of 16
@pytest.mark.parametrize("o,k", [(40, 128), (21, 96), (17, 672), (300, 1536), (9, 8960)])
def test_vnni_gives_the_avx2_paths_bits(o, k):
    packed, scales, bias = layer(o, k)
    x = torch.randn(9, k) * 3
    for m in (1, 2, 3, 4, 5, 9):
        for b in (bias, None):
            assert torch.equal(int4.linear(x[:m], packed, scales, b, int4.VNNI),
                               int4.linear(x[:m], packed, scales, b, int4.AVX2))


@pytest.mark.skipif(BEST is None, reason="no AVX2 here")
def test_passes_up_to_a_verify_pass_give_each_row_its_one_row_bits():
    packed, scales, bias = layer(40, 256)
    x = torch.randn(FP32_ROWS, 256)
    alone = torch.cat([int4.linear(x[i:i + 1], packed, scales, bias) for i in range(FP32_ROWS)])
    for m in (2, 5, 17, MAX_K + 1, FP32_ROWS):
        assert torch.equal(int4.linear(x[:m], packed, scales, bias), alone[:m])


@needs_tiles
def test_only_passes_wider_than_a_verify_pass_take_the_tiles():
    # The tiles add a row's sums in another order: their bits differ from the one-row pass's,
    # which is why they get only prompts.
    tiles = int4.AMX if BEST == int4.AMX else int4.VNNI_TILES
    packed, scales, bias = layer(40, 1536)
    x = torch.randn(FP32_ROWS + 1, 1536) * 4
    assert int4.path_for(FP32_ROWS) == int4.VNNI
    assert int4.path_for(FP32_ROWS + 1) == tiles
    wide = int4.linear(x, packed, scales, bias)
    assert torch.equal(wide, int4.linear(x, packed, scales, bias, tiles))
    narrow = int4.linear(x, packed, scales, bias, int4.VNNI)
    assert not torch.equal(wide, narrow) and torch.allclose(wide, narrow, rtol=1e-4, atol=1e-3)


@needs_tiles
@pytest.mark.parametrize("o,k", [(40, 1536), (21, 96)])  # a partial tile of rows; 3 blocks
def test_a_tile_pass_gives_each_row_the_same_bits_whatever_its_width(o, k):
    """A token's output on the tiles never depends on the other tokens of its pass (groups of
    16, zero-padded), so the same prompt token gets the same bits in any wide pass."""
    packed, scales, bias = layer(o, k)
    x = torch.randn(100, k) * 3
    full = int4.linear(x, packed, scales, bias, int4.VNNI_TILES)
    for m in (FP32_ROWS + 1, 64, 65, 99):
        assert torch.equal(int4.linear(x[:m], packed, scales, bias, int4.VNNI_TILES), full[:m])
    assert torch.equal(int4.linear(x[37:90], packed, scales, bias, int4.VNNI_TILES), full[37:90])


@pytest.mark.skipif(int4.AMX not in HAS, reason="this CPU has no AMX")
@pytest.mark.parametrize("o,k", [(40, 1536), (17, 672)])
def test_vnni_tiles_give_the_amx_tiles_bits(o, k):
    packed, scales, bias = layer(o, k)
    x = torch.randn(70, k) * 3
    for m in (1, 17, 70):
        assert torch.equal(int4.linear(x[:m], packed, scales, bias, int4.VNNI_TILES),
                           int4.linear(x[:m], packed, scales, bias, int4.AMX))


def test_the_widest_verify_pass_is_computed_row_by_row():
    assert MAX_K + 1 <= FP32_ROWS == int4.WIDE_ROWS


@pytest.mark.skipif(BEST is None, reason="no AVX2 here")
def test_a_path_the_cpu_lacks_is_refused():
    packed, scales, bias = layer(16, 32)
    with pytest.raises(ValueError, match="no int4-dyn path"):
        int4.linear(torch.ones(1, 32), packed, scales, bias, max(NAMES) + 1)


@needs_tiles
def test_a_drafts_passes_take_the_tiles_from_draft_tile_rows_and_a_targets_never_below_a_prompt():
    tiles = int4.AMX if BEST == int4.AMX else int4.VNNI_TILES
    assert int4.path_for(int4.DRAFT_TILE_ROWS - 1, exact=False) == int4.VNNI
    assert int4.path_for(int4.DRAFT_TILE_ROWS, exact=False) == tiles
    assert int4.path_for(int4.DRAFT_TILE_ROWS) == int4.path_for(FP32_ROWS) == int4.VNNI
    assert int4.DRAFT_TILE_ROWS <= MAX_K + 1  # else a draft's catch-ups would never reach them


@needs_tiles
@pytest.mark.parametrize("verifier", [True, False])
def test_a_quantized_drafts_layers_joined_or_not_compute_wide_passes_on_the_tiles(verifier):
    """Through the layers as a model holds them (q/k/v joined, o alone): a draft's pass of
    DRAFT_TILE_ROWS tokens gets the tiles' bits, a target's the one-row bits."""
    from torch import nn

    from specgen.kernels import quantize

    tiles = int4.AMX if BEST == int4.AMX else int4.VNNI_TILES
    torch.manual_seed(0)
    attn = nn.Module()
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        setattr(attn, name, nn.Linear(256, 32, bias=name != "o_proj"))
    quantize.apply(attn, "int4-dyn", verifier=verifier)
    assert attn.q_proj.joined is not None and attn.o_proj.joined is None
    x = torch.randn(int4.DRAFT_TILE_ROWS, 256) * 3
    want_path = int4.VNNI if verifier else tiles
    joined = attn.q_proj.joined
    q_want = int4.linear(x, joined.packed, joined.scales, joined.bias, want_path)[:, :32]
    o_want = int4.linear(x, attn.o_proj.weight, attn.o_proj.scales, None, want_path)
    q_rows = int4.linear(x, joined.packed, joined.scales, joined.bias, int4.VNNI)[:, :32]
    assert not torch.equal(q_want, q_rows) or verifier  # the two paths' bits differ here
    assert torch.equal(attn.q_proj(x), q_want)
    assert torch.equal(attn.o_proj(x), o_want)
