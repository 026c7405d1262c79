"""What a generation did, as plain data: where each token came from (its `Origin`, which
JSON, the history and the API call its "source") and the counts and timings of one run
(`Stats`), and the figures derived from them. No torch here: the run history and
`specgen stats` use it too."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from specgen.core.step import Step

# A token's origin. (loading/sources.py's `Source` is a model's files: another thing.)
Origin = Literal["accepted", "resampled", "bonus"]
ORIGINS: tuple[Origin, ...] = ("accepted", "resampled", "bonus")


@dataclass(frozen=True)
class Token:
    """One emitted token. `accepted`: a draft token the target kept; `resampled`: the
    target's replacement at the first rejection; `bonus`: the target's extra token after all
    K drafts passed (with K = 0, a plain target step, every token is a bonus)."""

    id: int
    source: Origin


@dataclass
class Stats:
    """What one generation did. Plain data: `to_dict()` is what JSON and the history store."""

    k_max: int
    adaptive: bool
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens the target actually ran (fewer when reused)
    new_tokens: int = 0
    target_passes: int = 0  # passes that made tokens: the prompt's (token 1), then one a step
    draft_passes: int = 0
    proposed: int = 0
    accepted: int = 0
    per_position_proposed: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    accepted_length_hist: list[int] = field(default_factory=list)  # steps with K > 0
    k_per_step: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0
    tree_steps: int = 0  # steps verified as a token tree (core/tree.py)
    branch_kept: int = 0  # of those, steps that kept a branch: one token more than the chain
    stop_reason: str = "running"
    graphs_off: str | None = None  # a CUDA decoder ran without graphs: its one line, why

    def __post_init__(self) -> None:
        self.per_position_proposed = self.per_position_proposed or [0] * self.k_max
        self.per_position_accepted = self.per_position_accepted or [0] * self.k_max
        self.accepted_length_hist = self.accepted_length_hist or [0] * (self.k_max + 1)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tau(self) -> float:
        """Mean tokens per target pass (1.0 is plain decoding)."""
        return self.new_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_seconds if self.total_seconds else 0.0

    @property
    def speedup_estimate(self) -> float:
        """The estimated speedup over plain decoding (step_speedup)."""
        return step_speedup(self.new_tokens, self.target_passes, len(self.k_per_step),
                            self.draft_seconds, self.verify_seconds)

    def record(self, step: Step) -> None:
        """A step of the loop (core/step.py): its counts, its tree, its timings."""
        self.record_step(step.drafted, step.kept)
        self.tree_steps += step.tree is not None
        self.branch_kept += step.branch_kept
        self.draft_seconds += step.draft_seconds
        self.verify_seconds += step.verify_seconds

    def record_step(self, k: int, n_accepted: int) -> None:
        self.target_passes += 1
        self.k_per_step.append(k)
        if k == 0:
            return
        self.proposed += k
        self.accepted += n_accepted
        self.accepted_length_hist[n_accepted] += 1
        for i in range(k):
            self.per_position_proposed[i] += 1
            self.per_position_accepted[i] += i < n_accepted

    def to_dict(self) -> dict:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate, "tau": self.tau,
                "tokens_per_second": self.tokens_per_second,
                "speedup_estimate": self.speedup_estimate}


def step_speedup(new_tokens: int, target_passes: int, steps: int, draft_seconds: float,
                 verify_seconds: float) -> float:
    """The estimated speedup over plain decoding of the same tokens, taking one verify pass as
    the cost of one plain step (slightly optimistic: a pass over K+1 tokens costs a little
    more); 0.0 without steps. Also of several runs' counts summed. Passes that are no step
    (the prompts': each gives one token, as in plain decoding) count as one plain step on
    both sides, so the estimate never exceeds tau, the tokens per target pass: it reaches
    tau only where drafting costs nothing."""
    spent = draft_seconds + verify_seconds
    if not spent or not steps:
        return 0.0
    step = verify_seconds / steps
    prompt_passes = max(0, target_passes - steps)
    return new_tokens * step / (spent + prompt_passes * step)
