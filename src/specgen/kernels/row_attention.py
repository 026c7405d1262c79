"""Attention one query row at a time, so that a token's result does not depend on the batch.

A verify pass runs the target over K+1 tokens; plain decoding runs it over one. With
the row-alone linears (linear.py, and the dynamic schemes of quantize.py), every linear layer
computes a row bit-identically either way, but the stock attention does not: over several
query rows it takes another kernel path whose float rounding differs in the last bit, and
quantizing the next layer's activations turns that bit into a whole quantization step, so
greedy speculation would drift from the target's own greedy output. Here row i of a pass attends to its
causal prefix with exactly the call that a one-token pass at that position makes, so the two
agree bit for bit. Each row is computed alone: in C where rows.py builds (one call a
layer), else by PyTorch (one small attention call per row).

Row by row serves one unpadded sequence per call, which is what specgen runs: its mask is
the causal prefix itself, so transformers builds none (`row_mask`). A model prepared this way
that is also called on a batch of several or padded sequences (its owner's own `generate`)
gets the mask it needs and transformers' stock attention for that call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specgen.kernels import rows as c_rows

NAME = "specgen_rows"


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
    if c_rows.attends(query, key, value):
        return c_rows.attention(query, key, value, scaling, window), None
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
