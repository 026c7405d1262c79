"""Host reads of tensor values counted on a CPU, step by step: what on a GPU would each be a
wait for the device (a sync). Every way a value leaves a tensor for the host is counted
(`item`, `tolist`, `cpu`, and `float()`, `int()`, `bool()` and indexing by a tensor), except
`numpy()`, which a CUDA tensor refuses: code that reads with it reads a host tensor, never
the device's. A step starts where the planner plans it; the prompt's pass (and its first
token) comes before the first step and is left out."""

from __future__ import annotations

import torch

READS = ("item", "tolist", "cpu", "__float__", "__int__", "__bool__", "__index__")


class HostReads:
    def __init__(self) -> None:
        self.before: list[int] = []  # reads before each plan: the prompt's, then each step's
        self.now = 0

    def per_step(self) -> list[int]:
        """Reads of each speculative step, in order (the last one's up to now)."""
        return (self.before + [self.now])[1:]


def count_host_reads(monkeypatch) -> HostReads:
    """From now on in the test, count every host read, step by step."""
    from specgen.core.adaptive import Planner

    reads = HostReads()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            reads.now += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    plan = Planner.plan

    def planned(self, *args, **kwargs):
        reads.before.append(reads.now)
        reads.now = 0
        return plan(self, *args, **kwargs)

    monkeypatch.setattr(Planner, "plan", planned)
    return reads
