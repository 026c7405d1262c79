"""RMSNorm, rotary embedding and causal attention one row at a time, for models on a CPU: in C
(rows.c) where it builds, and transformers' attention function that uses them
(`use_row_attention`).

Around its matmuls a decoder layer runs a dozen small PyTorch ops, each a few microseconds of
dispatch. Here each is one call, and each row is still computed alone by the same
instructions, so a verify pass gives every token the bits of a one-token pass; the lean
decoder's rotary, cache write and attention are one call (`rope_attend`). Where the library
cannot be built (no C compiler, no AVX2) `library()` is None and callers keep PyTorch's ops.

Why attention one query row at a time: a verify pass runs the target over K+1 tokens; plain
decoding runs it over one. With the row-alone linears (linear.py, gguf.py and the dynamic
schemes of quantize.py), every linear layer computes a row bit-identically either way, but
the stock attention does not: over several query rows it takes another kernel path whose
float rounding differs in the last bit, and quantizing the next layer's activations turns
that bit into a whole quantization step, so greedy speculation would drift from the target's
own greedy output. Here row i of a pass attends to its causal prefix with exactly the call
that a one-token pass at that position makes, so the two agree bit for bit: in C (one call a
layer), else by PyTorch (one small attention call per row).

Row by row serves one unpadded sequence per call, which is what specgen runs: its mask is
the causal prefix itself, so transformers builds none (`row_mask`). A model prepared this way
that is also called on a batch of several or padded sequences (its owner's own `generate`)
gets the mask it needs and transformers' stock attention for that call.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specgen.kernels import build
from specgen.kernels.build import FLOAT, C, I, I64, P

STEM = "rows"
NAME = "specgen_rows"  # the attention implementation a model prepared here records
# weight * x / sqrt(mean(x^2) + eps), in float32: transformers' Llama and Qwen2 norms, and
# specgen.models.llama's
NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "RMSNorm")

FUNCTIONS = {
    "rms_norm": C((P, P, P, I, I, FLOAT)),
    "attention_rows": C((P, P, I64, P, I64, P, I, I, I, I, I, I, FLOAT, P, I)),
    "rope_attend": C((P, P, P, P, P, P, P, I64, I, I, I, I, I, FLOAT, P, P, P, I)),
}


def library() -> ctypes.CDLL | None:
    """The compiled ops, built on first use; None where they cannot be built."""
    return build.load(STEM, "specgen's row ops", FUNCTIONS)


def address(name: str) -> int:
    """The address of one of the library's functions, for a kernel that calls it (gguf.c's
    layer: the same instructions as the calls here, so the same bits)."""
    return ctypes.cast(getattr(library(), name), ctypes.c_void_p).value


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
    scratch = torch.empty(threads, heads // kv_heads * t)  # each thread: a group's scores
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
    scratch = torch.empty(threads, heads // kv_heads * (start + m))  # as `attention`
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


def row_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                  attention_mask: Tensor | None, dropout: float = 0.0,
                  scaling: float | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' attention-function signature: query [B, H, M, D], key and value
    [B, H_kv, T, D] with the M new positions last; returns [B, M, H, D]."""
    if attention_mask is not None:  # several or padded sequences: not a pass specgen runs
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    window = kwargs.get("sliding_window")  # a sliding-window layer sees its last keys only
    if attends(query, key, value):
        return attention(query, key, value, scaling, window), None
    b, h, m, d = query.shape
    t, h_kv = key.shape[2], key.shape[1]
    # The query heads that share a key/value head become rows of one call (no copies of
    # the cache, as repeating the key/value heads would make).
    grouped = query.transpose(1, 2).reshape(b, m, h_kv, h // h_kv, d)
    spans = [(max(0, end - (window or t)), end) for end in range(t - m + 1, t + 1)]
    rows = [F.scaled_dot_product_attention(grouped[:, i], key[:, :, lo:hi], value[:, :, lo:hi],
                                           scale=scaling)
            for i, (lo, hi) in enumerate(spans)]
    out = torch.stack(rows, dim=1)  # [B, M, H_kv, H / H_kv, D]
    return out.reshape(b, m, h, d), None


def row_mask(batch_size: int, *args, attention_mask: Tensor | None = None, **kwargs
             ) -> Tensor | None:
    """transformers' mask-function signature: no mask for one sequence without padding
    (`row_attention` attends to each row's causal prefix, or its window), else the mask
    transformers' SDPA attention would get."""
    if batch_size == 1 and (attention_mask is None or bool(attention_mask.all())):
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(batch_size, *args, attention_mask=attention_mask, **kwargs)


def use_row_attention(model: nn.Module) -> None:
    """Switch a transformers model's attention to `row_attention` (specgen's own model tree,
    which only the lean decoder runs, just records the choice)."""
    if getattr(model, "lean_only", False):
        model.set_attn_implementation(NAME)
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, row_attention)
    AttentionMaskInterface.register(NAME, row_mask)
    model.set_attn_implementation(NAME)
