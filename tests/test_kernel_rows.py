"""kernels.rows: RMSNorm and row-by-row attention in C agree with PyTorch's, and each row is
computed alone (a verify pass gives each token the bits of a one-token pass)."""

from copy import deepcopy

import pytest
import torch

from specgen.kernels import rows


def qkv(m: int, t: int, d: int, capacity: int, seed: int = 0):
    """6 query heads over 2 key/value heads; keys and values a slice of a bigger cache, as
    the lean decoder holds them."""
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(2, 1, 2, capacity, d, generator=g)
    return torch.randn(1, 6, m, d, generator=g), cache[0, :, :, :t], cache[1, :, :, :t]


@pytest.mark.parametrize("d", [16, 72, 128])  # 72: a last partial group of 64 outputs
@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("window", [None, 7])
def test_attention_matches_pytorchs_row_by_row(d, m, window, without_kernel):
    assert rows.library() is not None  # this machine builds it: the C path is tested
    q, k, v = qkv(m, 40, d, capacity=64)
    assert rows.attends(q, k, v)
    got, _ = rows.row_attention(None, q, k, v, None, scaling=0.3, sliding_window=window)
    without_kernel("rows")  # as on a machine where rows.c cannot be built
    assert not rows.attends(q, k, v)
    want, _ = rows.row_attention(None, q, k, v, None, scaling=0.3, sliding_window=window)
    assert got.shape == want.shape == (1, m, 6, d)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("d", [72, 128])
def test_each_row_has_the_bits_of_a_one_row_call(d):
    q, k, v = qkv(5, 40, d, capacity=40, seed=1)
    many = rows.attention(q, k, v, 0.1)
    for i in range(5):
        t = 40 - 5 + i + 1  # the keys a one-token pass at row i's position holds
        one = rows.attention(q[:, :, i:i + 1], k[:, :, :t], v[:, :, :t], 0.1)
        assert torch.equal(many[:, i], one[:, 0])


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_row_norms_compute_what_transformers_norms_do(family, tiny_model):
    model = tiny_model(family, hidden=64)
    with torch.no_grad():  # not the initial ones: a weight that is all 1 would hide its use
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    in_c = deepcopy(model)
    assert rows.use_row_norms(in_c) == 2 * 2 + 1  # two a layer and the last
    assert all(type(m).__name__ != type(model.model.norm).__name__ for m in in_c.modules())
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        want, got = model(ids).logits, in_c(ids).logits
        x = torch.randn(3, 64)
        one = [in_c.model.norm(x[i:i + 1]) for i in range(3)]
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(torch.cat(one), in_c.model.norm(x))  # row by row


def test_without_the_library_pytorchs_norms_stay(without_kernel, tiny_model):
    without_kernel("rows")  # as on a machine where rows.c cannot be built
    model = tiny_model("qwen2", hidden=64)
    assert rows.use_row_norms(model) == 0
    assert type(model.model.norm).__name__ == "Qwen2RMSNorm"


def test_bf16_models_keep_their_norms(tiny_model):
    model = tiny_model("qwen2", hidden=64).to(torch.bfloat16)
    assert rows.use_row_norms(model) == 0
