"""Drafters: whatever proposes the K tokens the target verifies.

A drafter answers `propose(tokens, k)` with up to k token ids and the distribution each was
drawn from (None means one-hot: a deterministic guess, exact under rejection sampling), and
`rollback(n_valid)` when only the first n_valid context tokens survived verification.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from specgen.sampling import SamplingParams, probs_from_logits, sample


class Drafter(Protocol):
    def reset(self) -> None: ...

    def propose(
        self, tokens: Tensor, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor | None]: ...

    def rollback(self, n_valid: int) -> None: ...

    @property
    def forward_passes(self) -> int: ...


def forward(model: PreTrainedModel, ids: Tensor, cache: DynamicCache, n_logits: int) -> Tensor:
    """One cached forward over `ids` [T]; the logits of the last n_logits positions [n, V]."""
    out = model(input_ids=ids[None], cache=cache, use_cache=True, logits_to_keep=n_logits)
    return out.logits[0]


def crop(cache: DynamicCache, length: int) -> None:
    """Drop cached positions beyond `length` (rejected drafts)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class ModelDrafter:
    """A small causal LM that drafts autoregressively with its own KV cache.

    Its cache lags the context: after proposing d1..dK it holds d1..d(K-1) but not dK, and
    after a plain step it has not seen the newest tokens. `propose` feeds whatever is
    missing in one forward, so catching up never costs an extra pass."""

    def __init__(self, model: PreTrainedModel, vocab_size: int) -> None:
        self.model = model
        self.device = model.device
        # Draft tokens must be ids the target knows; the draft may have extra rows.
        self.input_vocab = model.get_input_embeddings().num_embeddings
        self.vocab_size = min(vocab_size, model.config.get_text_config().vocab_size)
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self._passes = 0

    @property
    def forward_passes(self) -> int:
        return self._passes

    def propose(
        self, tokens: Tensor, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor | None]:
        # Ids past the draft's embedding rows (a target with a larger vocabulary) are
        # clamped: that only worsens the guess, never the output's exactness.
        pending = tokens[self.cache.get_seq_length():].to(self.device).clamp_max(self.input_vocab - 1)
        ids, qs = [], []
        for _ in range(k):
            logits = forward(self.model, pending, self.cache, 1)[-1, : self.vocab_size]
            self._passes += 1
            if params.greedy:
                token = logits.argmax(-1)
            else:
                q = probs_from_logits(logits, params)
                token = sample(q, generator)
                qs.append(q)
            ids.append(token)
            pending = token[None]
        if not ids:
            return tokens.new_empty(0), None
        return torch.stack(ids), (torch.stack(qs) if qs else None)

    def rollback(self, n_valid: int) -> None:
        crop(self.cache, n_valid)
