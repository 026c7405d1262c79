"""`int4-gpu`: 4-bit weight-only linears on a CUDA GPU, through PyTorch's tinygemm kernel
(`torch.ops.aten._weight_int4pack_mm`, the kernel gpt-fast and torchao's int4 weight-only use).

Why this kernel for a verifier: it multiplies with tensor-core tiles of 16 input rows (m16n8k16)
and no split over the inputs, so a pass over up to 16 tokens reads the packed weights once, as a
one-token pass does (a verify pass of K + 1 <= 16 tokens costs about one step), and each row of
the output is computed by the same instructions whatever the other rows hold. bitsandbytes'
4-bit matmul on Hopper dequantizes the whole weight to bf16 past a few rows (its own dispatch
heuristic), reading several times the bytes; `bench/gpu.py` measures both curves.

Quantization (kernels.quantize.quantize_int4, the CPU int4-wo scheme's): asymmetric, groups of
GROUP inputs, w ~= (q - 8) * scale + zero with q in 0..15, scale and zero in bf16 as
[K / GROUP, N, 2]. The kernel takes the weights as nibble pairs (uint8 [N, K / 2], the even
input in the high nibble) converted once to its tile layout. The same quantized weights run on a
CPU through PyTorch's CPU int4 kernel, which is how the tests check this module without a GPU;
users get `int4-gpu` on CUDA only (loading refuses it elsewhere).

The output head stays in the model's dtype (as with bitsandbytes): it is a small share of a
large model's bytes, and the logits keep their precision.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from specgen.errors import ConfigError, ResourceError
from specgen.kernels.quantize import dequantize_int4, quantize_int4

GROUP = 128  # inputs per scale and zero
INNER_K_TILES = 8  # tinygemm's packing: 8 k-tiles of 16 inputs per 16-byte load
MIN_CAPABILITY = (8, 0)  # the kernel's bf16 tensor-core tiles: Ampere or newer


def fits(linear: nn.Module) -> bool:
    """Whether tinygemm takes this layer: inputs in whole groups (and whole 128-input
    super-tiles), outputs in whole tiles of 8."""
    return (isinstance(linear, nn.Linear) and linear.in_features % GROUP == 0
            and linear.in_features % (INNER_K_TILES * 16) == 0 and linear.out_features % 8 == 0)


def check_device(device: torch.device, dtype: torch.dtype) -> None:
    """One clear line where the kernel cannot run: no CUDA, an older GPU, or a dtype other
    than bf16 (the kernel's activations)."""
    if device.type != "cuda":
        raise ResourceError(
            f"quantization = \"int4-gpu\" runs PyTorch's CUDA int4 kernel, but the model is on "
            f"{device.type}. On a CPU use int4-dyn or int4-wo; on a GPU set device = \"cuda\".")
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        raise ResourceError(
            f"quantization = \"int4-gpu\" needs an NVIDIA GPU of compute capability 8.0 (Ampere) "
            f"or newer; {torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}. "
            "Use quantization = \"nf4\" (bitsandbytes) instead.")
    if dtype != torch.bfloat16:
        raise ConfigError(
            f"quantization = \"int4-gpu\" computes in bfloat16, but dtype is "
            f"{str(dtype).removeprefix('torch.')}. Set dtype = \"bfloat16\" (or \"auto\").")


def pack_nibbles(q: Tensor) -> Tensor:
    """int4 values [N, K] (0..15, any integer dtype) as uint8 [N, K / 2], the even input in
    the high nibble: the input `_convert_weight_to_int4pack` takes on CUDA."""
    q = q.to(torch.uint8)
    return (q[:, 0::2] << 4) | q[:, 1::2]


def unpack_nibbles(packed: Tensor) -> Tensor:
    """pack_nibbles' inverse: int32 [N, K]."""
    out = torch.stack([packed >> 4, packed & 0xF], dim=2)
    return out.reshape(packed.shape[0], -1).to(torch.int32)


def pack_for(q: Tensor, device: torch.device) -> Tensor:
    """The kernel's tile layout of int4 values q [N, K] on `device`."""
    if device.type == "cuda":
        return torch.ops.aten._convert_weight_to_int4pack(pack_nibbles(q.to(device)), INNER_K_TILES)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).cpu(), INNER_K_TILES)


def int4_mm(x: Tensor, packed: Tensor, scales_and_zeros: Tensor) -> Tensor:
    """x [M, K] bf16 times the packed weight's transpose: [M, N] bf16."""
    if x.device.type == "cuda":
        return torch.ops.aten._weight_int4pack_mm(x, packed, GROUP, scales_and_zeros)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_and_zeros)


class Int4Linear(nn.Module):
    """A 4-bit weight-only replacement for nn.Linear (inference only): `packed` in the
    kernel's layout for its device, `scales_and_zeros` bf16 [K / GROUP, N, 2]. Takes any float
    input, computes in bf16 and returns the input's dtype."""

    def __init__(self, in_features: int, out_features: int, packed: Tensor,
                 scales_and_zeros: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", bias)

    @classmethod
    def from_weight(cls, weight: Tensor, bias: Tensor | None = None,
                    device: torch.device | None = None) -> Int4Linear:
        """Quantize a float weight [N, K] (on any device; the arithmetic runs where it is)
        and pack it for `device` (default: the weight's)."""
        device = torch.device(device) if device is not None else weight.device
        n, k = weight.shape
        q, sz = quantize_int4(weight.detach(), GROUP)
        bias = None if bias is None else bias.detach().to(device, torch.bfloat16)
        return cls(k, n, pack_for(q, device), sz.to(device), bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int4Linear:
        return cls.from_weight(linear.weight, linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        y = int4_mm(x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous(),
                    self.packed, self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def int4_values(self, rows: int = 1024) -> Tensor:
        """The int4 values q [N, K] (int32, 0..15) this layer holds in the kernel's layout,
        read back through the kernel itself: with every scale 1 and every zero 8 it
        dequantizes q - 8 + 8 = q, and one-hot inputs (`rows` at a time) pick out each input
        column. Exact: every output is one small integer times 1, summed with zeros."""
        k, device = self.in_features, self.packed.device
        ones = torch.ones_like(self.scales_and_zeros[..., 0])
        identity_sz = torch.stack([ones, 8 * ones], -1)
        cols = []
        for at in range(0, k, rows):
            n = min(rows, k - at)
            onehot = torch.zeros(n, k, dtype=torch.bfloat16, device=device)
            onehot[torch.arange(n, device=device), torch.arange(at, at + n, device=device)] = 1
            cols.append(int4_mm(onehot, self.packed, identity_sz).to(torch.int32))
        return torch.cat(cols).T.contiguous()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={GROUP}, bias={self.bias is not None}")


def dequantized(weight: Tensor) -> Tensor:
    """What int4-gpu makes of a float weight [N, K], in float32: the reference its kernel
    approximates."""
    q, sz = quantize_int4(weight.detach(), GROUP)
    return dequantize_int4(q, sz, GROUP)


def targets(model: nn.Module) -> dict[str, nn.Linear]:
    """The linear layers int4-gpu quantizes: every one the kernel takes inside the decoder
    layers; the output head (and any layer the kernel cannot take) keeps its dtype."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return {name: m for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and m is not head and fits(m)}


def apply(model: nn.Module) -> nn.Module:
    """Replace `targets(model)` in place with Int4Linear layers on their own device, one at a
    time (each float weight is freed as its replacement is made), and return the model."""
    for name in list(targets(model)):
        parent, _, attr = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, attr, Int4Linear.from_linear(getattr(owner, attr)))
    return model
