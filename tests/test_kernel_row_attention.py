"""Row-by-row attention: a many-token pass gives each token the logits of a one-token pass."""

from copy import deepcopy

import pytest
import torch
from transformers.cache_utils import DynamicCache

from specgen.kernels import linear, prepare, quantize, rows
from specgen.kernels.rows import NAME, use_row_attention


def many_vs_one(model, ids: torch.Tensor, split: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of positions split.. from one pass over everything, and from one-token passes."""
    with torch.inference_mode():
        full = model(ids, cache=DynamicCache(config=model.config), use_cache=True).logits[0, split:]
        cache = DynamicCache(config=model.config)
        model(ids[:, :split], cache=cache, use_cache=True)
        steps = [model(ids[:, j:j + 1], cache=cache, use_cache=True).logits[0, 0]
                 for j in range(split, ids.shape[1])]
    return full, torch.stack(steps)


@pytest.fixture(scope="module")
def model(tiny_model):
    torch.manual_seed(0)
    return tiny_model("qwen2", vocab=64, hidden=64, layers=3)


def test_targets_whose_linears_compute_rows_alone_get_row_attention(model):
    quantized = prepare(deepcopy(model), "target", "int8-dyn")
    assert quantized.config._attn_implementation == NAME
    assert prepare(deepcopy(model), "target", "int8-wo").config._attn_implementation != NAME
    draft = prepare(deepcopy(model), "draft", "int8-dyn")  # a draft needs none
    assert draft.config._attn_implementation != NAME
    if linear.library() is not None:  # fp32 linears computed row by row in C
        assert prepare(deepcopy(model), "target").config._attn_implementation == NAME
    assert quantize.apply(deepcopy(model), "int8-dyn").config._attn_implementation != NAME


@pytest.mark.parametrize("ops", ["C", "PyTorch"])
def test_a_many_token_pass_equals_one_token_passes_bit_for_bit(model, ops, without_kernel):
    if ops == "PyTorch":  # a machine where rows.c cannot be built
        without_kernel("rows")
    else:
        assert rows.library() is not None
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(1))
    quantized = prepare(deepcopy(model), "target", "int8-dyn")
    for split in (1, 20, 35):
        full, steps = many_vs_one(quantized, ids, split)
        assert torch.equal(full, steps)


def assert_same_as_stock_attention(model, length: int, seed: int) -> None:
    """Same weights: row attention agrees with the model's own attention to rounding."""
    ids = torch.randint(0, 64, (1, length), generator=torch.Generator().manual_seed(seed))
    rows = deepcopy(model)
    use_row_attention(rows)
    with torch.inference_mode():
        want = model(ids).logits
        got = rows(ids).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_row_attention_computes_causal_attention(model):
    assert_same_as_stock_attention(model, 24, seed=2)


def test_a_sliding_window_is_respected(tiny_model):
    torch.manual_seed(0)
    windowed = tiny_model("qwen2", vocab=64, hidden=64, layers=2, use_sliding_window=True,
                          sliding_window=4, max_window_layers=0)
    assert_same_as_stock_attention(windowed, 16, seed=3)
