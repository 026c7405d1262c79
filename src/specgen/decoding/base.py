"""What every decoder answers, and the optional abilities a kind may have, each declared here
with its default (a kind that has one says so by overriding it): the engine and the drafters
read them as attributes, never by probing."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch import Tensor

    from specgen.decoding.capture import Capture


class Decoder(ABC):
    """hidden, logits, crop, reset and length are every decoder's own (decoding/__init__.py)."""

    # `hidden` and `logits` take `skip` (a lean.Skip: sub-layers left out), as self-speculative
    # drafting runs the target's own layers.
    skips: bool = False
    # It verifies a token tree in one pass: `tree_logits(ids, parents)`, then
    # `keep_branch(nodes)` (core/tree.py).
    verifies_trees: bool = False
    # The one line that says it gave up on CUDA graphs and runs eagerly, and why (cuda.py);
    # None: it did not, or it has none.
    graphs_off: str | None = None
    # Layers whose hidden states a drafting head asks each pass to keep (None: none), and
    # the passes' kept states (capture.py).
    capture_layers: tuple[int, ...] | None = None
    captured: list[Capture]
    # It runs a draft's one-token passes, each over the token the pass before drew, as one
    # CUDA graph: `chain(first, steps, pick, noise, key)` (cuda.py).
    draws_chains: bool = False

    length: int

    @abstractmethod
    def hidden(self, ids: Tensor, n: int = 1) -> Tensor:
        """The last n positions' final hidden states [n, H] after reading `ids` [T]."""

    @abstractmethod
    def logits(self, ids: Tensor, n: int = 1) -> Tensor:
        """The last n positions' logits [n, V] after reading `ids` [T]."""

    @abstractmethod
    def crop(self, length: int) -> None:
        """Forget cached positions beyond `length`."""

    @abstractmethod
    def reset(self) -> None:
        """Forget every cached position."""

    def reserve(self, positions: int, widest: int = 1, **passes: bool) -> None:
        """Room for `positions` in a static cache, with its passes of up to `widest` tokens
        (and the kinds in `passes`, e.g. `trees=True`) made ready before the first timed
        pass; nothing where the cache grows as it goes."""


class DraftModel(ABC):
    """A language model that a draft model drafts with (core/drafters.py: ModelDrafter), one
    next-token row at a time over its own KV cache: a transformers model (TorchDraft), the
    target with layers skipped (SkippedTarget) or a GGUF file run by llama.cpp
    (llamacpp.LlamaCppDraft). `logits`, `crop`, `reset` and `length` are every kind's own;
    the rest is declared here with its default."""

    vocab_size: int  # rows of its logits
    input_vocab: int  # token ids its embedding reads
    device: torch.device = torch.device("cpu")
    # Its layers' multiply-adds per token (None: not known, e.g. a GGUF run by llama.cpp).
    size: int | None = None
    # The one line that says its decoder gave up on CUDA graphs (None: it did not).
    graphs_off: str | None = None
    # It drafts k - 1 tokens after the first as one chain of passes on the device
    # (`chain`: cuda.py), with no host read between them.
    draws_chains: bool = False

    @property
    @abstractmethod
    def length(self) -> int:
        """Positions cached."""

    @abstractmethod
    def logits(self, ids: Tensor) -> Tensor:
        """The next token's logits [V] after reading `ids` [T] into the cache."""

    @abstractmethod
    def crop(self, length: int) -> None:
        """Forget cached positions beyond `length`."""

    @abstractmethod
    def reset(self) -> None:
        """Forget every cached position."""

    def reserve(self, positions: int, widest: int = 1) -> None:
        """Room for `positions` in a static cache (nothing where the cache grows as it goes)."""
