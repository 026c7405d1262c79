"""The skip-set search, apart from any model: candidates come from a ranking of the
target's sub-layers, and each is scored by `measure` (tokens per second of real speculative
steps, measured by the caller). Draft & Verify (Zhang et al. 2023) searches the same space by
Bayesian optimisation over thousands of trials; on a CPU with minutes to spend, the ranking
narrows it to sets worth measuring:

1. a ladder: the first sub-layers of the ranking, skipping 5% to 60% of the weights the
   layers read, and the default set;
2. the size: between the best rung and its neighbours;
3. local moves from the best set: drop one of its sub-layers, or add the next ones ranked.

Measurements are noisy (other processes, frequency changes), and the noise only ever slows
a measurement down: a candidate's rate is the best of its measurements. A candidate that beats
the best so far is measured again beside it, and one that falls far behind it is measured once
more, so that neither a lucky nor an unlucky measurement decides alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

SubLayer = tuple[str, int]  # ("attention" | "mlp", layer index)
LADDER = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6)  # fractions of the layers' weights skipped
LOCAL_MOVES = 6  # of each kind, around the best set
SECOND_CHANCE = 0.85  # a candidate this far below the best is measured once more


@dataclass(frozen=True)
class Score:
    tokens_per_second: float
    acceptance: float | None = None
    tau: float | None = None
    equal: bool = True  # the output equals plain decoding's (it must, on an exact target)


@dataclass
class Trial:
    skip: frozenset[SubLayer]
    scores: list[Score] = field(default_factory=list)
    phase: str = ""

    @property
    def rate(self) -> float:
        """Tokens per second: the best measurement (noise only slows one down)."""
        return max(s.tokens_per_second for s in self.scores)


def rank(importance: dict[SubLayer, float], cost: dict[SubLayer, float]) -> list[SubLayer]:
    """Sub-layers, cheapest to skip first: least change to the residual stream (importance)
    per weight saved (cost)."""
    return sorted(importance, key=lambda s: (importance[s] / cost[s], s))


def prefix_for(order: Sequence[SubLayer], cost: dict[SubLayer, float], fraction: float) -> int:
    """How many of `order`'s first sub-layers skip at least `fraction` of all the cost."""
    total, run = sum(cost.values()), 0.0
    for n, s in enumerate(order, 1):
        run += cost[s]
        if run >= fraction * total:
            return n
    return len(order)


class Search:
    """Candidates are measured in the order `candidates` yields them, while `time_left()`
    says a measurement still fits (the last one's duration). `measure(skip)` returns a Score;
    `on_trial(trial, best)` is told of each."""

    def __init__(self, order: Sequence[SubLayer], cost: dict[SubLayer, float],
                 measure: Callable[[frozenset[SubLayer]], Score], time_left: Callable[[], float],
                 default: frozenset[SubLayer] | None = None,
                 on_trial: Callable[[Trial, Trial | None], None] | None = None,
                 layers: int | None = None) -> None:
        self.order, self.cost, self.measure = list(order), cost, measure
        self.time_left, self.default, self.on_trial = time_left, default, on_trial
        self.layers = layers if layers is not None else len({i for _, i in order})
        self.trials: dict[frozenset[SubLayer], Trial] = {}
        self.best: Trial | None = None
        self.last_seconds = 0.0

    def allowed(self, skip: frozenset[SubLayer]) -> bool:
        return 0 < len(skip) < 2 * self.layers

    def run(self) -> Trial | None:
        for skip, phase in self.candidates():
            if self.time_left() < self.last_seconds:
                break
            if skip in self.trials or not self.allowed(skip):
                continue
            self.trial(skip, phase)
        return self.best

    def trial(self, skip: frozenset[SubLayer], phase: str) -> Trial:
        trial = self.trials[skip] = Trial(skip, phase=phase)
        self._measure(trial)
        best = self.best
        if best is None:
            self.best = trial
        elif trial.rate > best.rate:
            if self.time_left() >= 2 * self.last_seconds:
                self._measure(best)  # a rematch: both measured again
                self._measure(trial)
            if trial.rate > best.rate:
                self.best = trial
        elif trial.rate < SECOND_CHANCE * best.rate and self.time_left() >= self.last_seconds:
            self._measure(trial)  # far behind: perhaps a slow moment, perhaps a slow set
            if trial.rate > best.rate:
                self.best = trial
        if self.on_trial is not None:
            self.on_trial(trial, self.best)
        return trial

    def _measure(self, trial: Trial) -> None:
        start = time.perf_counter()
        trial.scores.append(self.measure(trial.skip))
        self.last_seconds = time.perf_counter() - start

    def candidates(self) -> Iterator[tuple[frozenset[SubLayer], str]]:
        """The ladder, then the size around the best rung, then local moves (which follow
        the best set as it changes)."""
        sizes = []
        for fraction in LADDER:
            n = prefix_for(self.order, self.cost, fraction)
            if n not in sizes:
                sizes.append(n)
        if self.default:
            yield self.default, "default"
        falling = 0
        for n in sizes:
            before = self.best
            yield frozenset(self.order[:n]), "ladder"
            # Past the peak, larger sets only lose more acceptance than they save.
            falling = falling + 1 if before is not None and self.best is before else 0
            if falling == 2:
                break
        best_n = self._prefix_size(self.best.skip) if self.best else None
        if best_n is not None:
            for m in sorted(sizes, key=lambda m: abs(m - best_n))[1:3]:
                yield frozenset(self.order[:(best_n + m) // 2]), "size"
        improved = True
        while improved:
            improved = False
            best = self.best
            if best is None:
                return
            for skip in self._moves(best.skip):
                yield skip, "local"
                if self.best is not best:
                    improved = True
                    break

    def _prefix_size(self, skip: frozenset[SubLayer]) -> int | None:
        n = len(skip)
        return n if frozenset(self.order[:n]) == skip else None

    def _moves(self, skip: frozenset[SubLayer]) -> Iterator[frozenset[SubLayer]]:
        """Add one of the next sub-layers ranked outside the set, or drop one of the set's
        last ranked, alternately."""
        inside = [s for s in self.order if s in skip]
        outside = [s for s in self.order if s not in skip]
        drops = [skip - {s} for s in reversed(inside[-LOCAL_MOVES:])]
        adds = [skip | {s} for s in outside[:LOCAL_MOVES]]
        for i in range(max(len(drops), len(adds))):
            if i < len(adds):
                yield adds[i]
            if i < len(drops):
                yield drops[i]
