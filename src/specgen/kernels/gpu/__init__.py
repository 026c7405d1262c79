"""specgen's own GPU kernels for passes of a few tokens (Triton), the fused decoder's only
entry point (decoding/fused.py).

Why its own: at batch 1 a layer of a Llama-family model is about nine operations, but
PyTorch runs it as dozens of kernels (RMSNorm alone as several), and cuBLAS picks a different
GEMM kernel for each number of rows, so a verify pass of K + 1 tokens rounds differently from
a one-token pass. These kernels compute every row of a pass of any width with the same tile
shape (16 rows) and the same reduction order (tiles.py), so a row's result never depends on
how many rows the call has: a verify pass gives each token the bits of a one-token pass.

The ops, each beside its PyTorch definition in reference.py:

    linear(x, w)                      x [M, K] @ w.T (+ bias): a `Weight`, dense or int4
    linear(gate_up, w, gated=True)    silu_mul(gate_up) @ w.T, the SiLU in the linear's loads
    linear(x, gate_up, silu=True)     silu_mul(x @ gate_up.T), the SiLU in the epilogue
    linear(x, qkv, rope=Rope(...))    rope_write(x @ qkv.T, ...), the rotation and the cache
                                      write in the epilogue
    add_rms_norm(x, residual, w, eps) (RMSNorm(x + residual) * w, x + residual)
    norm_linear(x, residual, nw, eps, w)  (linear(RMSNorm(x + residual) * nw, w), x + residual),
                                      silu= and rope= as linear's
    rope_write(qkv, cos, sin, kv, pos, hq, hkv)  rotated q; rotated k and v into the cache
    silu_mul(gate_up)                 silu(gate) * up
    attention(q, kv, pos, scale)      causal grouped-query attention over the cache (1 kernel)

`rope_write` and `attention` also take a token tree's rows (`tree=`, a `tree_table`): each row
at the position of its depth, attending its own ancestors, with the bits of a one-token pass
along its branch (core/tree.py has the layout).

`pos` is the first row's position as an int64 tensor [1] on the device, so one CUDA graph
serves every position. Triton is imported on first use: specgen imports without it, and
`available(device)` says whether these kernels can run (CUDA, or a CPU under Triton's
interpreter, TRITON_INTERPRET=1, which is how the tests run them).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from specgen.kernels.cuda_int4 import Int4Linear
from specgen.kernels.gpu import reference
from specgen.kernels.quantize import quantize_int4

GROUP = reference.GROUP


def available(device: torch.device | str) -> bool:
    """Whether the kernels run on `device`: Triton installed, and a CUDA device (or a CPU
    with Triton's interpreter on)."""
    device = torch.device(device)
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or (device.type == "cpu"
                                     and os.environ.get("TRITON_INTERPRET") == "1")


def _tiles():
    from specgen.kernels.gpu import tiles

    return tiles


# Nibble j of a word holds input NIBBLE_INPUTS[j] of its eight: inputs 2k and 2k + 1 sit in
# nibbles k and k + 4, so one shift and one mask give both as the two halves of a register
# (the int4 kernel's exponent trick turns such a pair into two floats at once).
NIBBLE_INPUTS = (0, 2, 4, 6, 1, 3, 5, 7)


def pack_int4(q: Tensor) -> Tensor:
    """int4 values q [N, K] (0..15) as int32 [N, K / 8]: input 8j + NIBBLE_INPUTS[i] in
    nibble i of word j (the int4 kernel unpacks a group of a tile in registers)."""
    n, k = q.shape
    order = torch.tensor(NIBBLE_INPUTS, device=q.device)
    grouped = q.to(torch.int64).reshape(n, k // 8, 8)[..., order]
    words = (grouped << (4 * torch.arange(8, device=q.device))).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_int4(packed: Tensor) -> Tensor:
    """pack_int4's inverse: int32 [N, K]."""
    shifts = 4 * torch.arange(8, device=packed.device, dtype=torch.int32)
    nibbles = (packed[..., None] >> shifts) & 0xF  # nibble order
    where = torch.tensor([NIBBLE_INPUTS.index(i) for i in range(8)], device=packed.device)
    return nibbles[..., where].reshape(packed.shape[0], -1)


def reserve(device: torch.device | str) -> None:
    """What the kernels keep per device (split-K's arrival counts, the int4 kernel's exponent
    bits), made now: before a CUDA graph is captured (FusedDecoder calls it)."""
    _tiles().counters(torch.device(device), 1 << 14)
    _tiles().exponents(torch.device(device))


@dataclass
class Weight:
    """A linear layer's weight as the kernels read it: `data` is the float weight [N, K]
    (a dense one) or the int4 values packed by pack_int4 [N, K / 8] with `scales_and_zeros`
    [N, K / GROUP, 2] (w ~= (q - 8) * scale + zero, as quantize.quantize_int4, whose
    [K / GROUP, N, 2] is transposed so that every part is output-major); `bias` [N]."""

    data: Tensor
    n: int
    k: int
    scales_and_zeros: Tensor | None = None
    bias: Tensor | None = None

    @property
    def is_int4(self) -> bool:
        return self.scales_and_zeros is not None

    @classmethod
    def dense(cls, w: Tensor, bias: Tensor | None = None) -> Weight:
        """The weight itself (no copy where it is contiguous)."""
        return cls(w.detach().contiguous(), w.shape[0], w.shape[1], None,
                   None if bias is None else bias.detach())

    @classmethod
    def int4(cls, q: Tensor, scales_and_zeros: Tensor, bias: Tensor | None = None) -> Weight:
        """From quantize_int4's output (GROUP inputs per group). Scales are kept in bf16 on
        a GPU and in fp32 on a CPU (the interpreter's bf16 is unreliable); both exact."""
        n, k = q.shape
        if k % GROUP:
            raise ValueError(f"int4 weights need whole groups of {GROUP} inputs, got {k}")
        dtype = torch.bfloat16 if q.device.type == "cuda" else torch.float32
        return cls(pack_int4(q), n, k, scales_and_zeros.transpose(0, 1).to(dtype).contiguous(),
                   None if bias is None else bias.detach())

    @classmethod
    def quantize(cls, w: Tensor, bias: Tensor | None = None) -> Weight:
        """A float weight [N, K] quantized to int4 (quantize.quantize_int4, GROUP)."""
        q, sz = quantize_int4(w.detach(), GROUP)
        return cls.int4(q, sz, bias)

    @classmethod
    def from_linear(cls, module: nn.Module) -> Weight:
        """A float linear layer's weight as it is, or an int4-gpu layer's int4 values and
        scales (a copy in this kernel's layout: the layer keeps tinygemm's). Other layers
        (bitsandbytes') are not taken (`takes`)."""
        if isinstance(module, Int4Linear):
            return cls.int4(module.int4_values(), module.scales_and_zeros, module.bias)
        if not takes(module):
            raise TypeError(f"the fused kernels take float linear layers, not {module!r}")
        return cls.dense(module.weight, module.bias)

    @classmethod
    def concat(cls, weights: list[Weight]) -> Weight:
        """Weights of one input side by side along N (q/k/v, gate/up: one GEMM each). A copy:
        the caller may point its layers at slices of it (decoding/fused.py does)."""
        if len({w.is_int4 for w in weights}) != 1 or len({w.k for w in weights}) != 1:
            raise ValueError("concatenated weights must share their kind and input size")
        biases = [w.bias for w in weights]
        bias = None
        if any(b is not None for b in biases):
            like = next(b for b in biases if b is not None)
            bias = torch.cat([b if b is not None else like.new_zeros(w.n)
                              for w, b in zip(weights, biases)])
        sz = torch.cat([w.scales_and_zeros for w in weights]) if weights[0].is_int4 else None
        return cls(torch.cat([w.data for w in weights]), sum(w.n for w in weights),
                   weights[0].k, sz, bias)


    def rows(self, start: int, end: int) -> Weight:
        """Outputs start..end-1 of this weight: views, no copy."""
        sz = None if self.scales_and_zeros is None else self.scales_and_zeros[start:end]
        bias = None if self.bias is None else self.bias[start:end]
        return Weight(self.data[start:end], end - start, self.k, sz, bias)


class FusedLinear(nn.Module):
    """A linear layer computed by `linear` (any number of rows): what an int4-gpu layer
    becomes once its weight lives in a `Weight` (decoding/fused.py), so that its values are
    kept once, in this layout, and the model's own forward still runs."""

    def __init__(self, weight: Weight) -> None:
        super().__init__()
        self.weight_ = weight
        self.in_features, self.out_features = weight.k, weight.n

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        return linear(x.reshape(-1, self.in_features), self.weight_).reshape(
            *shape[:-1], self.out_features)


def takes(module: nn.Module) -> bool:
    """Whether `Weight.from_linear` takes the layer: an nn.Linear (or a subclass that keeps
    its float weight [out, in], as the CPU's row-alone linears do)."""
    return (isinstance(module, nn.Linear)
            and module.weight.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and tuple(module.weight.shape) == (module.out_features, module.in_features))


@dataclass
class Rope:
    """Where a q/k/v linear's epilogue sends its outputs, as rope_write does: cos, sin
    [capacity, D] tables, the cache kv [2, kv_heads, capacity, D] (rows written at slots
    pos..pos+M-1), pos an int64 tensor [1], and a token tree's table (`tree_table`) or None."""

    cos: Tensor
    sin: Tensor
    kv: Tensor
    pos: Tensor
    q_heads: int
    kv_heads: int
    tree: Tensor | None = None


# --- the ops (M <= any width; one tile shape for every M) -------------------------------------

def linear(x: Tensor, w: Weight, gated: bool = False, silu: bool = False,
           rope: Rope | None = None) -> Tensor:
    """x [M, K] @ w.T (+ bias) -> [M, N] in x's dtype; fp32 accumulation, one K order.
    gated: x is [gate | up] [M, 2K] and the inputs are silu_mul(x), computed in the linear's
    loads with silu_mul's rounding (the same bits as the two kernels, one launch fewer).
    silu: w is [gate | up] (N = 2I) and the output silu_mul(x @ w.T) [M, I], computed in the
    epilogue (a tile loads the gate and up rows of the same outputs) with the rounding of
    linear then silu_mul: the same bits, one launch fewer.
    rope: w is q/k/v (rope.q_heads, then kv_heads twice, heads of D) and the output is
    rope_write(x @ w.T, ...)'s q [M, q_heads, D], k and v written to rope.kv, computed in the
    epilogue (a tile loads the rows of both halves of the same heads' inputs) with the
    rounding of linear then rope_write: the same bits, one launch fewer."""
    return _tiles().linear(x, w.data, w.bias, w.n, w.is_int4, w.scales_and_zeros, gated,
                           silu=silu, rope=rope)


def norm_linear(x: Tensor, residual: Tensor | None, norm: Tensor, eps: float,
                w: Weight, silu: bool = False,
                rope: Rope | None = None) -> tuple[Tensor, Tensor]:
    """(linear(add_rms_norm(x, residual, norm, eps)[0], w, silu=, rope=), x + residual) in
    one kernel, w dense or int4: the RMSNorm in the linear's loads, each program taking a
    row's sum of squares over all of K in one fixed order (blocks of 128 inputs, added in
    order: reference.norm_linear), so every part of a split K normalises a row alike."""
    return _tiles().linear(x, w.data, w.bias, w.n, w.is_int4, w.scales_and_zeros,
                           norm=(residual, norm, eps), silu=silu, rope=rope)


def add_rms_norm(x: Tensor, residual: Tensor | None, weight: Tensor,
                 eps: float) -> tuple[Tensor, Tensor]:
    """(normed, summed): summed = x + residual (x where residual is None), normed =
    RMSNorm(summed) * weight as transformers' LlamaRMSNorm. One kernel."""
    return _tiles().add_rms_norm(x, residual, weight, eps)


def rope_write(qkv: Tensor, cos: Tensor, sin: Tensor, kv: Tensor, pos: Tensor, hq: int,
               hkv: int, tree: Tensor | None = None) -> Tensor:
    """q [M, hq, D] rotated at positions pos..pos+M-1; k (rotated) and v written to the
    cache kv [2, hkv, capacity, D] there. cos, sin: [capacity, D] tables. One kernel.
    `tree` (a tree_table): row r is rotated at pos + its depth, still written at pos + r."""
    return _tiles().rope_write(qkv, cos, sin, kv, pos, hq, hkv, tree)


def silu_mul(gate_up: Tensor) -> Tensor:
    """silu(gate) * up of gate_up [M, 2I] = [gate | up] -> [M, I]. One kernel."""
    return _tiles().silu_mul(gate_up)


def attention(q: Tensor, kv: Tensor, pos: Tensor, scale: float, tree: Tensor | None = None,
              **blocks: int) -> Tensor:
    """q [M, hq, D]: row r attends cache slots 0..pos+r of kv [2, hkv, capacity, D].
    Flash-decoding in one kernel: chunks of the cache fixed by slot, merged in slot order by
    the last program of a (head, row tile) to arrive.
    `tree` (a tree_table, rows at slots pos..pos+M-1): row r attends the slots below pos and
    then, position by position, those of its ancestors and itself. `blocks` (chunk=,
    block_kv=) changes the fixed split (tests use small ones)."""
    return _tiles().attention(q, kv, pos, scale, tree=tree, **blocks)


def tree_table(parents: list[int] | tuple[int, ...], width: int) -> Tensor:
    """A token tree (parents in preorder, -1 at the root) as the kernels read it, on the host:
    int32 [width, width + 1], row r = its depth, then its ancestor at each depth 0..depth
    (itself last), then -1. Rows past the tree are -1 (a pass never reads them)."""
    rows = [[-1] * (width + 1) for _ in range(width)]
    paths: list[list[int]] = []
    for r, parent in enumerate(parents):
        paths.append((paths[parent] if r else []) + [r])
        rows[r][: len(paths[r]) + 1] = [len(paths[r]) - 1, *paths[r]]
    return torch.tensor(rows, dtype=torch.int32)
