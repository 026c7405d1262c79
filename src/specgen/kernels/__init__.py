"""The CPU backend: C kernels (built once, loaded through ctypes), the quantized and the
row-alone linear layers, RMSNorm and attention one row at a time.

`prepare(model, role)` is the one entry point: it makes a loaded transformers model fast on
this CPU for its role and decides, here and nowhere else, whether a target verifies exactly
(every token of a verify pass gets the bits of a one-token pass).

Beside the CPU backend, `cuda_int4.py` is the `int4-gpu` scheme's linear for CUDA GPUs
(loading/streamed.py quantizes a model into it as it loads), and `gpu/` is specgen's own
Triton kernels, each row independent of the pass's width (decoding/fused.py runs them)."""

from __future__ import annotations

from typing import Literal

from torch import nn

from specgen.choices import CPU_SCHEMES, DYNAMIC_SCHEMES, STORED_SCHEME

Role = Literal["target", "draft"]
ROLES = ("target", "draft")


def prepare(model: nn.Module, role: Role = "target", quantization: str = "none") -> nn.Module:
    """Ready `model` (in place) for `role` on this CPU, and return it.

    - `quantization` one of choices.CPU_SCHEMES: its linear layers are quantized
      (kernels.quantize), unless they already are (a packed model loaded from the cache);
      STORED_SCHEME: its linears are a GGUF file's blocks (kernels.gguf), which compute each
      row alone;
    - plain fp32 and bf16 CPU linears compute each row alone (kernels.linear);
    - a dynamic scheme's float32 RMSNorms run in C (kernels.rows);
    - a target whose every linear computes each row alone also attends row by row
      (kernels.rows): then a verify pass gives each token exactly the logits of a
      one-token pass, and greedy speculation reproduces the target's own greedy output.

    A model on another device, or one whose layers are none of these, is left as it is."""
    from specgen.errors import ConfigError
    from specgen.kernels import linear, quantize, rows

    if role not in ROLES:
        raise ConfigError(f"role must be 'target' or 'draft', got {role!r}.")
    if quantization in CPU_SCHEMES:
        quantize.apply(model, quantization, verifier=role == "target")
    elif quantization not in ("none", STORED_SCHEME):
        raise ConfigError(f"kernels.prepare quantizes with the CPU schemes "
                          f"({', '.join(CPU_SCHEMES)}), not {quantization!r}.")
    integer = quantization in (*DYNAMIC_SCHEMES, STORED_SCHEME)  # int8 activations, row alone
    # An integer scheme leaves no float linear to switch (lm_head included).
    rows_alone = integer or linear.use_decode_linears(model) > 0
    if integer:  # the small ops around integer matmuls are worth the C
        rows.use_row_norms(model)
    if role == "target" and rows_alone and hasattr(model, "set_attn_implementation"):
        rows.use_row_attention(model)
    return model
