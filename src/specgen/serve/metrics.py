"""The server's counters, read as Prometheus text (exposition format 0.0.4) at /metrics.

Generation counters are folded in when a request's generation ends (the worker thread);
request counters when a response status is known (the event loop). One lock guards both.
Names follow Prometheus conventions: counters end in `_total`, base units in the name."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

from specgen.core.stats import ORIGINS, Stats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()  # (endpoint, status)
        self.rejected: Counter[str] = Counter()  # reason: queue_full, shutting_down
        self.runs: Counter[str] = Counter()  # ended: completed, interrupted, error
        self.tokens: Counter[str] = Counter()  # source
        self.prompt_tokens = 0
        self.prefill_tokens = 0
        self.target_passes = 0
        self.proposed = 0
        self.accepted = 0
        self.position_proposed: list[int] = []
        self.position_accepted: list[int] = []
        self.generation_seconds = 0.0

    def count_request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[endpoint, status] += 1

    def count_rejected(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] += 1

    def fold(self, stats: Stats, sources: Counter[str], ended: str) -> None:
        """Add one generation's counts."""
        with self._lock:
            self.runs[ended] += 1
            self.tokens.update(sources)
            self.prompt_tokens += stats.prompt_tokens
            self.prefill_tokens += stats.prefill_tokens
            self.target_passes += stats.target_passes
            self.proposed += stats.proposed
            self.accepted += stats.accepted
            self.generation_seconds += stats.total_seconds
            for mine, theirs in ((self.position_proposed, stats.per_position_proposed),
                                 (self.position_accepted, stats.per_position_accepted)):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, n in enumerate(theirs):
                    mine[i] += n

    def render(self, queue_length: int, running: bool) -> str:
        """The exposition text; every line ends in a newline."""
        out: list[str] = []

        def metric(name: str, kind: str, doc: str,
                   samples: Iterable[tuple[dict[str, str], float]]) -> None:
            out.append(f"# HELP {name} {doc}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                out.append(f"{name}{_labels(labels)} {_number(value)}")

        with self._lock:
            metric("specgen_requests_total", "counter", "HTTP requests answered, by endpoint and status.",
                   [({"endpoint": e, "status": str(s)}, n) for (e, s), n in sorted(self.requests.items())])
            metric("specgen_requests_rejected_total", "counter",
                   "Requests refused before generation because the queue was full or the server was stopping.",
                   [({"reason": r}, self.rejected[r]) for r in ("queue_full", "shutting_down")])
            metric("specgen_queue_length", "gauge", "Requests waiting for the generator.",
                   [({}, queue_length)])
            metric("specgen_requests_running", "gauge", "Requests generating now (0 or 1).",
                   [({}, int(running))])
            metric("specgen_generations_total", "counter", "Generations run, by how they ended.",
                   [({"ended": e}, self.runs[e]) for e in ("completed", "interrupted", "error")])
            metric("specgen_prompt_tokens_total", "counter", "Prompt tokens of the generations.",
                   [({}, self.prompt_tokens)])
            metric("specgen_prefill_tokens_total", "counter",
                   "Prompt tokens the target ran (the rest were reused from the cache).",
                   [({}, self.prefill_tokens)])
            metric("specgen_generated_tokens_total", "counter",
                   "Generated tokens, by source: accepted (a draft token the target kept), "
                   "resampled (the target's correction), bonus (the target's extra token).",
                   [({"source": s}, self.tokens[s]) for s in ORIGINS])
            metric("specgen_target_passes_total", "counter", "Target forward passes that made tokens.",
                   [({}, self.target_passes)])
            metric("specgen_draft_tokens_proposed_total", "counter", "Draft tokens proposed.",
                   [({}, self.proposed)])
            metric("specgen_draft_tokens_accepted_total", "counter", "Draft tokens the target kept.",
                   [({}, self.accepted)])
            metric("specgen_draft_position_proposed_total", "counter",
                   "Draft tokens proposed at each draft position (1 is the first).",
                   [({"position": str(i + 1)}, n) for i, n in enumerate(self.position_proposed)])
            metric("specgen_draft_position_accepted_total", "counter",
                   "Draft tokens kept at each draft position (1 is the first).",
                   [({"position": str(i + 1)}, n) for i, n in enumerate(self.position_accepted)])
            metric("specgen_acceptance_rate", "gauge", "Draft tokens kept over draft tokens proposed, so far.",
                   [({}, self.accepted / self.proposed if self.proposed else 0.0)])
            metric("specgen_generation_seconds_total", "counter", "Seconds spent generating.",
                   [({}, self.generation_seconds)])
        return "\n".join(out) + "\n"


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return repr(float(value))
