"""What every decoder answers, and the optional abilities a kind may have, each declared here
with its default (a kind that has one says so by overriding it): the engine and the drafters
read them as attributes, never by probing."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from specgen.decoding.capture import Capture


class Decoder:
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

    def hidden(self, ids: Tensor, n: int = 1) -> Tensor:
        raise NotImplementedError

    def logits(self, ids: Tensor, n: int = 1) -> Tensor:
        raise NotImplementedError

    def crop(self, length: int) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def reserve(self, positions: int, widest: int = 1, **passes: bool) -> None:
        """Room for `positions` in a static cache, with its passes of up to `widest` tokens
        (and the kinds in `passes`, e.g. `trees=True`) made ready before the first timed
        pass; nothing where the cache grows as it goes."""
