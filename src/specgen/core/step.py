"""A step of the loop as values: what the planner asks for before it (`Plan`) and what it did
(`Step`), built once by the engine after verification and read by the planner and the stats."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from specgen.core.base import Drafter
    from specgen.core.tree import Tree


@dataclass(frozen=True)
class Plan:
    """What the next step drafts: `drafter` (None: a plain step) up to `k` tokens, stopping
    early below `stop_below` if it ends its own drafts; `guesser` names its estimate;
    `explore`: the step is there to measure the guesser."""

    guesser: str | None
    drafter: Drafter | None
    k: int
    stop_below: float = 0.0
    explore: bool = False  # a trial or probe: its cost counts against EXPLORE_SHARE


PLAIN = Plan(None, None, 0)


@dataclass(frozen=True)
class Step:
    """What one step did, as verification decided it and the host read it (in the step's one
    transfer). `drafted` tokens were proposed (a drafter may find fewer than `plan.k`); the
    target kept `kept` of them (of the chain, or of a `tree`'s kept branch, `path`: its nodes,
    root excluded), `chain` of those the chain's own (fewer only where a branch was kept),
    and added its own token: `tokens` on the device and their `ids` on the host, the kept
    ones first. `sure` is the target's top probability at the step's first position;
    `draft_seconds` and `verify_seconds` what drafting and the verify pass took. The
    prompt's pass is a step too: a plain one, untimed."""

    plan: Plan
    drafted: int
    kept: int
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    chain: int | None = None  # None: all that were kept (a chain)
    tree: Tree | None = None
    path: tuple[int, ...] = ()
    tokens: Tensor | None = None
    ids: tuple[int, ...] = ()
    sure: float | None = None

    @property
    def width(self) -> int:
        """The verify pass's rows past the pending token: the drafts, or the tree's nodes."""
        return self.drafted if self.tree is None else self.tree.rows - 1

    @property
    def chain_kept(self) -> int:
        """Kept drafts that are the chain's own: the drafter is judged on these (a branch's
        token is the tree's, paid by its rows)."""
        return self.kept if self.chain is None else self.chain

    @property
    def branch_kept(self) -> bool:
        """A tree's branch was kept: one token more than the chain gave."""
        return self.chain_kept < self.kept

    @property
    def bonus(self) -> bool:
        """Every draft was kept, so the target's token is a bonus (else it resampled)."""
        return self.kept == self.drafted
