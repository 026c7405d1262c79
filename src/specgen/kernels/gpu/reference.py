"""The math of each fused GPU op in PyTorch (kernels/gpu/triton.py computes the same): what
the tests hold each kernel to, and the definition a reader checks a kernel against.

Each function computes in float32 and rounds to the input's dtype where transformers' Llama
layers round (residual sums, the normed state before its weight, each rotary product, the
SiLU before the product with `up`)."""

from __future__ import annotations

import torch
from torch import Tensor


GROUP = 128  # int4 inputs per scale and zero (the int4-gpu scheme's)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [M, K] times weight [N, K] transposed, accumulated in fp32, plus bias: x's dtype."""
    y = x.float() @ weight.float().T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def linear_int4(x: Tensor, q: Tensor, scales_and_zeros: Tensor,
                bias: Tensor | None = None) -> Tensor:
    """linear with the int4 weight w = (q - 8) * scale + zero of quantize.dequantize_int4,
    summed as the kernel sums it, in fp32 without rounding w: per group of GROUP inputs,
    scale * (x . (q - 8)) + x . zero, the groups added in order."""
    n, k = q.shape
    sz = scales_and_zeros.float().transpose(0, 1)  # [N, K / GROUP, 2]
    xs = x.float().reshape(x.shape[0], k // GROUP, GROUP)
    qs = (q.float() - 8).reshape(n, k // GROUP, GROUP)
    y = torch.zeros(x.shape[0], n, dtype=torch.float32, device=x.device)
    for g in range(k // GROUP):
        y = y + (xs[:, g] @ qs[:, g].T) * sz[:, g, 0] + xs[:, g].sum(-1, keepdim=True) * sz[:, g, 1]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def add_rms_norm(x: Tensor, residual: Tensor | None, weight: Tensor,
                 eps: float) -> tuple[Tensor, Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual), as transformers' LlamaRMSNorm: the
    variance in fp32, the normed state cast back to the dtype, then times the weight."""
    summed = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    s = summed.float()
    normed = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (normed.float() * weight.float()).to(x.dtype), summed


def norm_linear(x: Tensor, residual: Tensor | None, norm: Tensor, eps: float,
                weight: Tensor, bias: Tensor | None = None,
                block: int = 128) -> tuple[Tensor, Tensor]:
    """(linear(RMSNorm(x + residual) * norm, weight), x + residual): add_rms_norm's math and
    rounding, but the row's sum of squares taken as the fused linear takes it, in blocks of
    `block` inputs added in order (add_rms_norm's is one sum over the row)."""
    summed = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    s = summed.float()
    ss = torch.zeros(s.shape[0], dtype=torch.float32, device=s.device)
    for k0 in range(0, s.shape[1], block):
        ss = ss + s[:, k0:k0 + block].pow(2).sum(-1)
    normed = (s * (1.0 / torch.sqrt(ss / s.shape[1] + eps))[:, None]).to(x.dtype)
    h = (normed.float() * norm.float()).to(x.dtype)
    return linear(h, weight, bias), summed


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """transformers' apply_rotary_pos_emb for one tensor [M, heads, D] with cos, sin [M, D]
    (rotate_half convention), each product rounded to the dtype as PyTorch's ops do."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    return ((x.float() * cos.float()).to(x.dtype).float()
            + (rotated.float() * sin.float()).to(x.dtype).float()).to(x.dtype)


def rope_write(qkv: Tensor, cos: Tensor, sin: Tensor, kv: Tensor, pos: int, hq: int,
               hkv: int, depths: list[int] | None = None) -> Tensor:
    """Rotate q and k of qkv [M, (hq + 2 hkv) D] at positions pos..pos+M-1 (cos, sin
    [capacity, D] tables), write k and v into kv [2, hkv, capacity, D] there; rotated q.
    A token tree's rows (`depths`) are rotated at pos + their depth, and written at pos + row."""
    m, d = qkv.shape[0], kv.shape[-1]
    q, k, v = qkv.view(m, hq + 2 * hkv, d).split([hq, hkv, hkv], 1)
    at = pos + torch.tensor(depths if depths is not None else range(m), device=qkv.device)
    c, s = cos[at], sin[at]
    kv[0, :, pos:pos + m] = rotate(k, c, s).transpose(0, 1)
    kv[1, :, pos:pos + m] = v.transpose(0, 1)
    return rotate(q, c, s)


def silu_mul(gate_up: Tensor) -> Tensor:
    """silu(gate) * up of gate_up [M, 2I] = [gate | up], as transformers' MLP."""
    gate, up = gate_up.float().chunk(2, -1)
    act = (gate / (1 + torch.exp(-gate))).to(gate_up.dtype)
    return (act.float() * up).to(gate_up.dtype)


def attention(q: Tensor, kv: Tensor, pos: int, scale: float,
              parents: list[int] | None = None) -> Tensor:
    """q [M, hq, D] at positions pos..pos+M-1 over kv [2, hkv, capacity, D]: row r attends
    slots 0..pos+r (grouped-query: hq / hkv query heads per key/value head). [M, hq, D].
    A token tree's rows (`parents`, core/tree.py's layout, at slots pos..pos+M-1): row r
    attends the slots below pos and those of its ancestors and itself."""
    m, hq, d = q.shape
    hkv = kv.shape[1]
    keys = kv[0, :, :pos + m].float().repeat_interleave(hq // hkv, 0)  # [hq, T, D]
    values = kv[1, :, :pos + m].float().repeat_interleave(hq // hkv, 0)
    scores = torch.einsum("mhd,htd->hmt", q.float(), keys) * scale
    slots = torch.arange(pos + m, device=q.device)
    visible = slots[None, :] <= pos + torch.arange(m, device=q.device)[:, None]
    if parents is not None:
        visible[:, pos:] = torch.eye(m, dtype=torch.bool, device=q.device)
        for r in range(m):
            a = parents[r]
            while a >= 0:
                visible[r, pos + a] = True
                a = parents[a]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hmt,htd->mhd", probs, values).to(q.dtype)
