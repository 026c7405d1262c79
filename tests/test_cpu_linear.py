"""WeightMajorLinear computes the same product as nn.Linear; only plain fp32 layers switch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specgen.cpu_linear import WeightMajorLinear, use_weight_major_linears
from specgen.quantize import QuantLinear


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 1, 24), (1, 5, 24), (3, 4, 24), (24,)])
def test_same_result_as_nn_linear(bias, shape):
    torch.manual_seed(0)
    layer = nn.Linear(24, 40, bias=bias)
    x = torch.randn(shape)
    expected = layer(x)
    use_weight_major_linears(layer)
    assert type(layer) is WeightMajorLinear
    got = layer(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_only_plain_fp32_layers_switch():
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32).to(torch.bfloat16),
                          QuantLinear.from_linear(nn.Linear(32, 32), "int8-wo"))
    weight = model[0].weight
    assert use_weight_major_linears(model) == 1
    assert type(model[0]) is WeightMajorLinear and model[0].weight is weight  # no copy
    assert type(model[1]) is nn.Linear and type(model[2]) is QuantLinear
    assert use_weight_major_linears(model) == 0  # already switched
