"""transformers' own forward over a DynamicCache: any architecture transformers runs."""

from __future__ import annotations

from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from specgen.decoding.base import Decoder
from specgen.decoding.capture import Capture


def forward(model: PreTrainedModel, ids: Tensor, cache: DynamicCache, n_logits: int,
            states: bool = False):
    """One cached forward over `ids` [T]; the logits of the last n_logits positions [n, V]
    (with `states`: and every layer's input, then the final hidden states, [1, T, H] each)."""
    out = model(input_ids=ids[None], cache=cache, use_cache=True, logits_to_keep=n_logits,
                output_hidden_states=states)
    return (out.logits[0], out.hidden_states) if states else out.logits[0]


def hidden(model: PreTrainedModel, ids: Tensor, cache: DynamicCache, states: bool = False):
    """One cached forward of the model's body (no output layer): last hidden states [T, H]
    (with `states`: and the layers' inputs, as `forward`)."""
    out = model.base_model(input_ids=ids[None], cache=cache, use_cache=True,
                           output_hidden_states=states)
    return (out.last_hidden_state[0], out.hidden_states) if states else out.last_hidden_state[0]


def crop(cache: DynamicCache, length: int) -> None:
    """Drop cached positions beyond `length` (rejected drafts)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class HFDecoder(Decoder):
    """transformers' own forward with a DynamicCache: any architecture."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.capture_layers: tuple[int, ...] | None = None  # as LeanDecoder's
        self.captured: list[Capture] = []

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def hidden(self, ids: Tensor, n: int = 1) -> Tensor:
        if self.capture_layers is None:
            return hidden(self.model, ids, self.cache)[-n:]
        start = self.length
        out, states = hidden(self.model, ids, self.cache, states=True)
        self._keep(start, states)
        return out[-n:]

    def logits(self, ids: Tensor, n: int = 1) -> Tensor:
        if self.capture_layers is None:
            return forward(self.model, ids, self.cache, n)
        start = self.length
        out, states = forward(self.model, ids, self.cache, n, states=True)
        self._keep(start, states)
        return out

    def _keep(self, start: int, states: tuple[Tensor, ...]) -> None:
        """transformers' hidden_states: [i] is layer i's input, the last the final normed one."""
        self.captured.append(Capture(start, states[-1][0], [states[i][0] for i in self.capture_layers]))

    def crop(self, length: int) -> None:
        crop(self.cache, length)

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
