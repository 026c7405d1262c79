"""The Drafter base: what every drafter answers, and each optional ability a kind may have,
declared with its default (a kind that has one overrides it). The engine and the planner read
them as attributes, never by probing; what is a drafter at all is what inherits `Drafter`
(core/drafters.py: the kinds; core/head_drafters.py: heads on the target)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedModel

    from specgen.core.sampling import SamplingParams
    from specgen.decoding import Decoder


class Drafter(ABC):
    """Whatever proposes the drafts: `guessers` and `propose` are every kind's own; every
    other ability is declared here with its default, and a kind that has it says so by
    overriding it."""

    # Stops a draft by its own confidence (honours `propose`'s stop_below).
    ends_own_drafts: bool = False
    # Its q (returned with greedy drafts too) ranks the next-likeliest tokens a token tree
    # may branch to (core/tree.py).
    branches: bool = False
    # Its state holds its own drafts: after a tree it is valid only as far as the kept branch
    # follows its chain (the engine rolls it back there). A head holds true features only.
    holds_drafts: bool = True
    # Its layers' multiply-adds per token (None: not known): the planner's prior for what its
    # reading costs against the target's, until its passes are measured.
    size: int | None = None
    # The last propose's reading of unread context: (tokens, seconds), when its first
    # forward read CATCH_UP_TOKENS or more; else (0, 0.0).
    catch_up: tuple[int, float] = (0, 0.0)
    # The one line that says its decoder gave up on CUDA graphs (None: it did not).
    graphs_off: str | None = None
    # Where its generator draws (None: the target's device).
    device: torch.device | None = None
    # The last propose's branch scores (tree.branch_scores, on the host), where it read them
    # with its drafts in its one wait for the device; None: the engine scores q itself.
    read_branches: tuple[Tensor, Tensor] | None = None

    def bind_target(self, decoder: Decoder, model: PreTrainedModel) -> None:
        """Take the target's decoder and model; the generator calls it once, when it is made.
        Nothing for a drafter that drafts with none of the target's own weights, cache or
        hidden states."""

    @abstractmethod
    def guessers(self, tokens: Tensor) -> dict[str, Drafter]:
        """Who could draft the next step, by name, each with the drafter that drafts for it."""

    @abstractmethod
    def propose(
        self, tokens: Tensor, k: int, params: SamplingParams, generator: torch.Generator | None,
        stop_below: float = 0.0,
    ) -> tuple[Tensor, Tensor | None]:
        """Up to k draft tokens after `tokens` and their q (None: one-hot), stopping sooner where
        it ends its own drafts and the draft's odds of all so far fall below `stop_below`."""

    def rollback(self, n_valid: int) -> None:
        """Only the first n_valid context tokens survived verification."""

    def reset(self) -> None:
        """Forget the context (a new conversation)."""

    def unread(self, tokens: Tensor) -> int:
        """Tokens of `tokens` it would read before its next guess (none: it reads nothing of
        its own)."""
        return 0

    def reserve(self, positions: int, widest: int = 1) -> None:
        """Room for `positions` in a static cache, with its passes of up to `widest` tokens
        made ready, before a generation's first timed pass (nothing: it keeps none)."""

    @property
    def forward_passes(self) -> int:
        return 0
