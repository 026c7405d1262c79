"""DecodeLinear computes nn.Linear's product (C kernel or PyTorch's), each row alone; only
plain fp32 and bf16 CPU layers switch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specgen.kernels import linear
from specgen.kernels.linear import DecodeLinear, use_decode_linears
from specgen.kernels.quantize import QuantLinear

needs_kernel = pytest.mark.skipif(linear.library() is None,
                                  reason="no C compiler or no AVX2 here")
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def bf16_path(path: int, name: str):
    return pytest.param(torch.bfloat16, path, id=f"bfloat16-{name}", marks=pytest.mark.skipif(
        linear.bf16_path() < path, reason=f"this CPU has no {name}"))


# The kernel's paths: fp32 and bf16 in AVX2 wherever it builds; bf16 also by `vdpbf16ps` on
# an AVX512-BF16 CPU and by AMX tiles on an AMX one.
PATHS = [(torch.float32, linear.AVX2), bf16_path(linear.AVX2, "AVX2"),
         bf16_path(linear.DOT, "AVX512-BF16"), bf16_path(linear.AMX, "AMX")]


def reference(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    y = x.double() @ layer.weight.double().t()
    return y if layer.bias is None else y + layer.bias.double()


@needs_kernel
@pytest.mark.parametrize("dtype,path", PATHS)
@pytest.mark.parametrize("bias", [True, False])
# 37: inputs past the last 32 and 16; AMX blocks of 32 and 16 weight rows, and fewer (by DOT)
@pytest.mark.parametrize("k,n", [(64, 40), (37, 19), (1536, 24), (96, 80)])
def test_kernel_matches_a_float64_product(dtype, path, bias, k, n):
    torch.manual_seed(0)
    layer = nn.Linear(k, n, bias=bias).to(dtype)
    for m in (1, 2, 3, 4, 5, 7, 17, 130):  # 130: the kernel takes 64 rows at a time
        x = torch.randn(m, k).to(dtype)
        got = linear.linear(x, layer.weight, layer.bias, path)
        assert got.dtype == dtype and got.shape == (m, n)
        want = reference(x, layer)
        scale = want.abs().max().item()
        assert (got.double() - want).abs().max().item() <= TOLERANCE[dtype] * scale


@needs_kernel
@pytest.mark.parametrize("dtype,path", PATHS)
@pytest.mark.parametrize("k,n", [(200, 45), (256, 61)])  # whole tiles and leftovers
def test_each_row_has_the_bits_of_a_one_row_pass(dtype, path, k, n):
    """What makes a verify pass exact: a token's outputs do not depend on the rows beside it."""
    torch.manual_seed(1)
    layer = nn.Linear(k, n).to(dtype)
    x = torch.randn(40, k).to(dtype)  # AMX: up to 3 tiles of 16 tokens
    many = linear.linear(x, layer.weight, layer.bias, path)
    for m in (1, 2, 3, 5, 17, 33):
        alone = torch.cat([linear.linear(x[i:i + 1], layer.weight, layer.bias, path)
                           for i in range(m)])
        assert torch.equal(linear.linear(x[:m], layer.weight, layer.bias, path), alone)
        assert torch.equal(many[:m], alone)


needs_32_registers = pytest.mark.skipif(
    linear.library() is None or linear.library().avx2_registers(0) < 32,
    reason="this CPU has no AVX512VL (the AVX2 path's 32-register tiles)")


@needs_32_registers
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k,n", [(200, 45), (1536, 70)])  # leftover inputs and weight rows
def test_avx2_tiles_give_the_same_bits_in_16_and_32_registers(dtype, k, n):
    """The 32-register tiles (4 weight rows by 4 tokens) sum each output as the 16-register ones
    do: a model's outputs do not depend on which the CPU allows, and each row stays alone."""
    torch.manual_seed(2)
    layer = nn.Linear(k, n).to(dtype)
    x = torch.randn(48, k).to(dtype)
    for m in (1, 2, 3, 4, 5, 6, 9, 30, 48):
        by = {}
        for registers in (16, 32):
            with linear.avx2_registers(registers) as used:
                assert used == registers
                by[registers] = linear.linear(x[:m], layer.weight, layer.bias, linear.AVX2)
                alone = torch.cat([linear.linear(x[i:i + 1], layer.weight, layer.bias, linear.AVX2)
                                   for i in range(m)])
                assert torch.equal(by[registers], alone)
        assert torch.equal(by[16], by[32])
    assert linear.library().avx2_registers(0) == 32  # put back


@pytest.mark.parametrize("kernel", [True, False], ids=["C", "pytorch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 1, 24), (1, 5, 24), (3, 4, 24), (24,), (1, 60, 24)])
def test_same_result_as_nn_linear(kernel, dtype, bias, shape, monkeypatch):
    if kernel and linear.library() is None:
        pytest.skip("no C compiler or no AVX2 here")
    torch.manual_seed(0)
    layer = nn.Linear(24, 40, bias=bias).to(dtype)
    x = torch.randn(shape).to(dtype)
    want = reference(x, layer)
    use_decode_linears(layer)
    assert type(layer) is DecodeLinear
    if not kernel:  # the library gone after the switch: PyTorch's products
        monkeypatch.setattr(linear, "library", lambda: None)
    with torch.inference_mode():
        got = layer(x)
    assert got.shape == want.shape and got.dtype == dtype
    assert (got.double() - want).abs().max().item() <= TOLERANCE[dtype] * want.abs().max().item()


@needs_kernel
def test_kernel_serves_decoding_passes_and_not_gradients(monkeypatch):
    calls = []
    real = linear.linear
    monkeypatch.setattr(linear, "linear", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    layer = nn.Linear(16, 8)
    use_decode_linears(layer)
    with torch.no_grad():
        layer(torch.randn(5, 16))  # a verify pass
        layer(torch.randn(linear.FP32_ROWS + 1, 16))  # a long fp32 prompt: W @ x.T
        layer.to(torch.bfloat16)(torch.randn(100, 16).to(torch.bfloat16))  # bf16: always C
    layer.float()(torch.randn(2, 16)).sum().backward()  # training: PyTorch's, with a gradient
    assert calls == [5, 100] and layer.weight.grad is not None


def test_only_plain_fp32_and_bf16_cpu_layers_switch():
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32).to(torch.bfloat16),
                          nn.Linear(32, 32).to(torch.float16),
                          QuantLinear.from_linear(nn.Linear(32, 32), "int8-wo"))
    weight = model[0].weight
    assert use_decode_linears(model) == 2
    assert type(model[0]) is DecodeLinear and model[0].weight is weight  # no copy
    assert type(model[1]) is DecodeLinear
    assert type(model[2]) is nn.Linear and type(model[3]) is QuantLinear
    assert use_decode_linears(model) == 0  # already switched


def test_no_layer_switches_where_the_library_does_not_build(monkeypatch):
    monkeypatch.setattr(linear, "library", lambda: None)
    layer = nn.Linear(32, 32)
    assert use_decode_linears(layer) == 0 and type(layer) is nn.Linear


@pytest.mark.skipif(linear.bf16_path() == linear.AVX2,
                    reason="this CPU has no AVX512-BF16 or AMX")
def test_bf16_layers_take_the_fastest_path_the_cpu_has():
    torch.manual_seed(2)
    layer = nn.Linear(1536, 64).to(torch.bfloat16)
    with torch.no_grad():  # the second half of each sum cancels the first: the order shows
        layer.weight[:, 768:] = layer.weight[:, :768]
    half = torch.randn(5, 768) * 256
    x = torch.cat([half, -half], 1).to(torch.bfloat16)
    by_path = [linear.linear(x, layer.weight, layer.bias, path)
               for path in range(linear.bf16_path() + 1)]
    assert not any(torch.equal(by_path[-1], other) for other in by_path[:-1])
    use_decode_linears(layer)
    with torch.inference_mode():
        assert torch.equal(layer(x), by_path[-1])


def test_a_path_the_cpu_lacks_is_refused():
    if linear.library() is None:
        pytest.skip("no C compiler or no AVX2 here")
    with pytest.raises(ValueError, match="no bf16 path"):
        linear.linear(torch.ones(1, 32, dtype=torch.bfloat16),
                          torch.ones(16, 32, dtype=torch.bfloat16), None, linear.AMX + 1)
