"""transformers' own forward over a DynamicCache: any architecture transformers runs."""

from __future__ import annotations

from torch import Tensor
from transformers import DynamicCache, PreTrainedModel


def forward(model: PreTrainedModel, ids: Tensor, cache: DynamicCache, n_logits: int) -> Tensor:
    """One cached forward over `ids` [T]; the logits of the last n_logits positions [n, V]."""
    out = model(input_ids=ids[None], cache=cache, use_cache=True, logits_to_keep=n_logits)
    return out.logits[0]


def hidden(model: PreTrainedModel, ids: Tensor, cache: DynamicCache) -> Tensor:
    """One cached forward of the model's body (no output layer): last hidden states [T, H]."""
    return model.base_model(input_ids=ids[None], cache=cache, use_cache=True).last_hidden_state[0]


def crop(cache: DynamicCache, length: int) -> None:
    """Drop cached positions beyond `length` (rejected drafts)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class HFDecoder:
    """transformers' own forward with a DynamicCache: any architecture."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.cache = DynamicCache(config=model.config)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def hidden(self, ids: Tensor, n: int = 1) -> Tensor:
        return hidden(self.model, ids, self.cache)[-n:]

    def logits(self, ids: Tensor, n: int = 1) -> Tensor:
        return forward(self.model, ids, self.cache, n)

    def crop(self, length: int) -> None:
        crop(self.cache, length)

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
