"""int8-dyn's own kernel (kernels/int8.c): fbgemm's dynamic linear, bit for bit, on every path
this CPU has, from the weights as stored."""

import pytest
import torch

from specgen.kernels import int8, quantize

pytestmark = pytest.mark.skipif(int8.library() is None, reason="the int8 kernel cannot be built here")


def fbgemm(x, q, scale, exact):
    """What int8-dyn computed through fbgemm: a verifier's rows each scaled into [-1, 1] with
    an anchor row [1, -1, 0, ...] beside them; a draft's as fbgemm scales them by itself."""
    packed = quantize.prepack_int8(q, scale)
    if not exact:
        return quantize.linear_int8_dyn(x, packed)
    amax = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)
    rows = torch.cat([x / amax, quantize.row_anchor(x.shape[1])])
    return quantize.linear_int8_dyn(rows, packed)[:-1] * amax


# rows, inputs, outputs; inputs not a multiple of 64 (or of 32) take the kernels' tails
SHAPES = [(1, 64, 8), (4, 1536, 37), (5, 200, 6), (9, 70, 12), (17, 96, 4), (3, 8960, 5)]


@pytest.mark.parametrize("path", [int8.AVX2, int8.VNNI])
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_kernel_gives_fbgemms_bits(path, exact, shape):
    if path not in int8.paths():
        pytest.skip("this CPU has no AVX512-VNNI")
    m, k, n = shape
    gen = torch.Generator().manual_seed(m * k + n)
    q, scale = quantize.quantize_int8(torch.randn(n, k, generator=gen) * 0.05)
    for x in (torch.randn(m, k, generator=gen),  # activations of several ranges and signs
              torch.randn(m, k, generator=gen).abs() * 1e3,
              -torch.rand(m, k, generator=gen) * 1e-6,  # a scale below PyTorch's threshold
              torch.zeros(m, k),
              torch.randn(m, k, generator=gen) * torch.tensor([0.0, 1.0]).repeat(k // 2 + 1)[:k]):
        assert torch.equal(int8.linear(x, q, scale, exact, path), fbgemm(x, q, scale, exact))


def test_a_verifier_row_is_computed_alone():
    """A verifier's output for a token never depends on the other tokens of its pass."""
    gen = torch.Generator().manual_seed(1)
    q, scale = quantize.quantize_int8(torch.randn(24, 300, generator=gen))
    x = torch.randn(11, 300, generator=gen) * torch.logspace(-3, 3, 11)[:, None]
    full = int8.linear(x, q, scale, exact=True)
    for i in range(11):
        assert torch.equal(int8.linear(x[i:i + 1], q, scale, exact=True), full[i:i + 1])


def test_every_path_gives_the_same_bits_on_a_prompt_wide_pass():
    gen = torch.Generator().manual_seed(2)
    q, scale = quantize.quantize_int8(torch.randn(50, 256, generator=gen))
    x = torch.randn(130, 256, generator=gen)
    outs = [int8.linear(x, q, scale, exact, path) for exact in (True, False) for path in int8.paths()]
    assert all(torch.equal(outs[0], o) for o in outs[:len(int8.paths())])
    assert all(torch.equal(outs[-1], o) for o in outs[len(int8.paths()):])


def test_an_int8_dyn_layer_without_its_kernel_packs_for_fbgemm_and_gives_the_same_bits():
    from torch import nn

    from specgen.kernels import build

    torch.manual_seed(3)
    linear = nn.Linear(96, 40, bias=True)
    own, fallback = (quantize.QuantLinear.from_linear(linear, "int8-dyn") for _ in range(2))
    x = torch.randn(6, 96)
    with build.swapped("int8", None, int8.FUNCTIONS):
        want = fallback(x)
    assert fallback.packed is not None and fallback.weight is None  # fbgemm's copy, not ours too
    assert own.packed is None and torch.equal(own(x), want)
