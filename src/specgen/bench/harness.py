"""The one harness every side-by-side measurement runs on: `specgen bench` (runner.py),
bench/gpu.py and the scripts in bench/. Contestants run prompt by prompt, each once per
repeat, in an order rotated so that machine drift and warm caches hit every contestant
alike (`interleave`); figures are summarised as medians over repeats and geometric means
over prompts (`median`, `medians`, `geomean`, `ratio`). Plain Python: no torch."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Trial(Generic[T]):
    """One call of one contestant on one prompt."""

    prompt: int
    repeat: int
    name: str
    seconds: float  # the call's wall time, between two syncs
    value: T  # what the call returned


def schedule(n_prompts: int, names: Sequence[str], repeats: int = 1) -> list[tuple[int, int, str]]:
    """(prompt, repeat, contestant) in run order: prompt by prompt, every contestant once per
    repeat, the order rotated by one place each repeat and each prompt, so that no contestant
    always runs first (warm caches) or last."""
    order = []
    for p in range(n_prompts):
        for r in range(repeats):
            shift = (p + r) % len(names)
            order += [(p, r, name) for name in [*names[shift:], *names[:shift]]]
    return order


def interleave(names: Sequence[str], n_prompts: int, call: Callable[[str, int, int], T], *,
               repeats: int = 1, warm_up: Callable[[str], object] | None = None,
               runs: Callable[[str, int], bool] | None = None,
               sync: Callable[[], object] | None = None,
               on_trial: Callable[[Trial[T]], None] | None = None,
               on_prompt: Callable[[int, list[Trial[T]]], None] | None = None) -> list[Trial[T]]:
    """`call(name, prompt, repeat)` for every slot of `schedule`, after one unrecorded
    `warm_up(name)` per contestant (first-call allocations, graph capture, lazy loading).
    `runs(name, prompt)` False skips a slot (a contestant run on the first prompts only);
    `sync` waits for queued device work, around every timed call; `on_trial` sees each
    trial as it ends, `on_prompt` each prompt's trials once its last one has."""
    sync = sync or (lambda: None)
    if warm_up is not None:
        for name in names:
            warm_up(name)
    trials: list[Trial[T]] = []
    this_prompt: list[Trial[T]] = []
    slots = [s for s in schedule(n_prompts, names, repeats) if runs is None or runs(s[2], s[0])]
    for i, (p, r, name) in enumerate(slots):
        sync()
        start = time.perf_counter()
        value = call(name, p, r)
        sync()
        trial = Trial(p, r, name, time.perf_counter() - start, value)
        trials.append(trial)
        this_prompt.append(trial)
        if on_trial is not None:
            on_trial(trial)
        if i + 1 == len(slots) or slots[i + 1][0] != p:
            if on_prompt is not None:
                on_prompt(p, this_prompt)
            this_prompt = []
    return trials


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None; None if there are none."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def geomean(values: Iterable[float | None]) -> float | None:
    """The geometric mean of the positive values (None, zero: not measured); None if none."""
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def medians(trials: Iterable[Trial], value: Callable[[Trial], float | None]
            ) -> dict[tuple[int, str], float | None]:
    """(prompt, contestant) -> the median over its repeats of `value(trial)`."""
    groups: dict[tuple[int, str], list[float | None]] = {}
    for t in trials:
        groups.setdefault((t.prompt, t.name), []).append(value(t))
    return {key: median(values) for key, values in groups.items()}


def ratio(table: dict[tuple[int, str], float | None], name: str, base: str,
          prompts: Iterable[int]) -> float | None:
    """The geometric mean over `prompts` of `name`'s figure over `base`'s, per prompt (a
    prompt either did not run is left out)."""
    return geomean([table[p, name] / table[p, base] for p in prompts
                    if table.get((p, name)) and table.get((p, base))])
