"""RMSNorm, rotary embedding and causal attention one row at a time, in C (rows.c), for
models on a CPU.

Around its matmuls a decoder layer runs a dozen small PyTorch ops, each a few microseconds of
dispatch, and the row-by-row attention (row_attention.py) makes one call per row. Here each is
one call, and each row is still computed alone by the same instructions, so a verify pass
gives every token the bits of a one-token pass; the lean decoder's rotary, cache write and
attention are one call (`rope_attend`). Where the library cannot be built (no C compiler, no
AVX2) `library()` is None and callers keep PyTorch's ops.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor, nn

from specgen.kernels import build

STEM = "rows"
# weight * x / sqrt(mean(x^2) + eps), in float32: transformers' Llama and Qwen2 norms, and
# specgen.models.llama's
NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "RMSNorm")

def declare(lib: ctypes.CDLL) -> None:
    p, i, f, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_int64
    lib.rms_norm.argtypes = [p, p, p, i, i, f]
    lib.attention_rows.argtypes = [p, p, i64, p, i64, p, i, i, i, i, i, i, f, p, i]
    lib.rope_attend.argtypes = [p, p, p, p, p, p, p, i64, i, i, i, i, i, f, p, p, p, i]


def library() -> ctypes.CDLL | None:
    """The compiled ops, built on first use; None where they cannot be built."""
    return build.load(STEM, "specgen's row ops", declare)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x [..., k] float32 on the CPU, normalised by its root mean square, times weight [k]."""
    k = x.shape[-1]
    rows = x.reshape(-1, k).contiguous()
    y = torch.empty_like(rows)
    library().rms_norm(rows.data_ptr(), weight.data_ptr(), y.data_ptr(), rows.shape[0], k, eps)
    return y.view(x.shape)


def usable(x: Tensor, head_dim: int) -> bool:
    """Whether the ops take a model whose hidden states are like x; else PyTorch's."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and head_dim % 8 == 0
            and library() is not None)


def attends(query: Tensor, key: Tensor, value: Tensor) -> bool:
    """Whether `attention` takes these (transformers' layout, see there)."""
    return (query.shape[0] == 1 and key.dtype == value.dtype == query.dtype
            and key.stride(-1) == value.stride(-1) == 1
            and key.stride(2) == value.stride(2) == query.shape[-1]
            and usable(query, query.shape[-1]))


def attention(query: Tensor, key: Tensor, value: Tensor, scaling: float | None,
              window: int | None = None) -> Tensor:
    """Causal attention of the m new positions, the last m of the t keys: query [1, heads,
    m, d], key and value [1, kv_heads, t, d] (positions contiguous: a DynamicCache's, or a
    slice of a preallocated cache); [1, m, heads, d]. Row i sees its last `window` positions."""
    _, heads, m, d = query.shape
    kv_heads, t = key.shape[1], key.shape[2]
    rows = query.transpose(1, 2).contiguous()  # [1, m, heads, d]
    out = torch.empty_like(rows)
    threads = torch.get_num_threads()
    scratch = torch.empty(threads, t)
    library().attention_rows(rows.data_ptr(), key.data_ptr(), key.stride(1), value.data_ptr(),
                             value.stride(1), out.data_ptr(), m, heads, kv_heads, t, d,
                             window or t, d ** -0.5 if scaling is None else scaling,
                             scratch.data_ptr(), threads)
    return out


def rope_attend(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, cache: Tensor,
                start: int, scaling: float) -> Tensor:
    """A layer's attention for the lean decoder (decoder.py), in one call: the new rows'
    queries and keys rotated as transformers rotates them (bit for bit), keys and values
    written into `cache` [2 (keys, values), 1, kv_heads, capacity, d] at positions start..,
    then `attention` over positions up to start + m. q [m, heads * d], k and v [m, kv_heads
    * d], cos and sin [m, d]; returns [m, heads * d]."""
    m = q.shape[0]
    kv_heads, capacity, d = cache.shape[2:]
    heads = q.shape[1] // d
    q, k, v, cos, sin = (t.contiguous() for t in (q, k, v, cos, sin))
    rotated, out = torch.empty(m, heads, d), torch.empty(m, heads * d)
    threads = torch.get_num_threads()
    scratch = torch.empty(threads, start + m)
    library().rope_attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                          cache[0].data_ptr(), cache[1].data_ptr(), capacity * d, start, m, heads,
                          kv_heads, d, scaling, rotated.data_ptr(), out.data_ptr(),
                          scratch.data_ptr(), threads)
    return out


class RowRMSNorm(nn.Module):
    """A Llama/Qwen2 RMSNorm (float32, CPU) computed by `rms_norm`: switched in place."""

    weight: Tensor
    variance_epsilon: float

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.variance_epsilon)


def use_row_norms(model: nn.Module) -> int:
    """Switch the model's float32 CPU RMSNorms to RowRMSNorm where the library builds;
    returns how many were switched."""
    norms = [m for m in model.modules() if type(m).__name__ in NORMS
             and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]
    if not norms or library() is None:
        return 0
    for norm in norms:
        norm.__class__ = RowRMSNorm
    return len(norms)
