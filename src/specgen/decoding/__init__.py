"""How a model runs over its KV cache. Every decoder answers the same small interface:

    hidden(ids, n)  the last n positions' final hidden states (after the last norm), [n, H]
    logits(ids, n)  their logits, [n, V]
    crop(length)    forget cached positions beyond `length` (rollback is a length)
    reset()         forget everything
    length          positions cached

A target's decoder also keeps, when a drafting head asks (`capture_layers` not None), each
pass's hidden states in `captured` (capture.py).

`HFDecoder` is transformers' own forward (any architecture); `LeanDecoder` calls a
Llama-family model's layers directly (hf.py, lean.py). llama.cpp's draft runtime answers the
same interface (llamacpp.py).
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor
from transformers import PreTrainedModel

from specgen.decoding.capture import Capture
from specgen.decoding.hf import HFDecoder
from specgen.decoding.lean import LeanDecoder, attends_by_rows, lean_supported


class Decoder(Protocol):
    length: int

    def hidden(self, ids: Tensor, n: int = 1) -> Tensor: ...

    def logits(self, ids: Tensor, n: int = 1) -> Tensor: ...

    def crop(self, length: int) -> None: ...

    def reset(self) -> None: ...

    capture_layers: tuple[int, ...] | None
    captured: list[Capture]


def make_decoder(model: PreTrainedModel, exact: bool = False) -> HFDecoder | LeanDecoder:
    """The lean decoder where it serves; `exact`: it must compute what transformers' forward
    computes, bit for bit (a target's)."""
    lean = lean_supported(model) and (attends_by_rows(model) or not exact)
    return LeanDecoder(model) if lean else HFDecoder(model)
