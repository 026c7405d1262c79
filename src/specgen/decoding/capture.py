"""What a target's pass leaves for a drafting head (heads/, core/head_drafters.py): the
hidden states that pass computed anyway, so a head costs no extra target work.

A decoder captures only when asked: `capture_layers` is None (keep nothing: the default) or
the indices of the layers whose inputs a head reads (EAGLE-3's low, middle and high layers;
empty for EAGLE-1/2 and Medusa, which read the final states only). Each pass then appends one
`Capture` to the decoder's `captured` list, which the head's drafter empties."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


# A pass's states as a decoder computes them: the final normed rows [m, H], and the captured
# layers' inputs [m, H] each.
States = tuple[Tensor, list[Tensor]]


@dataclass
class Capture:
    start: int  # the position of the pass's first row
    final: Tensor  # [m, H] the final hidden states after the last norm, every row of the pass
    layer_inputs: list[Tensor]  # [m, H] each: the inputs of `capture_layers`, in that order

    def rows(self, index: Tensor) -> Capture:
        """The pass as if it had been over rows `index` only (a token tree's kept branch)."""
        return Capture(self.start, self.final.index_select(0, index),
                       [t.index_select(0, index) for t in self.layer_inputs])


def keep_branch_states(captured: list[Capture], start: int, index: Tensor) -> None:
    """After a token tree's pass starting at `start` (its rows in the tree's order): its
    capture keeps the kept branch's rows (`index`: the root, then the branch) in the order
    of their positions, which is what a head reads."""
    if captured and captured[-1].start == start:
        captured[-1] = captured[-1].rows(index)
