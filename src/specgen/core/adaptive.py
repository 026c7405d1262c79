"""Who drafts each step, and how much: the guesser and K with the most expected tokens per second.

The planner keeps one `Estimate` per guesser (a hybrid's prompt lookup and draft model are two):
its acceptance (draft tokens kept and rejected, over a prior), its draft pass's cost and, for a
guesser that ends its own drafts, the measured yield of such drafts; beside them the measured
cost of a target pass per width (`verify_cost`, the target's whoever drafted) and a `Book` of
costs that outlive an answer. One rule decides each step: of a plain step and every offered
guesser at every K (for a guesser that does not end its own drafts, at most twice the widest
pass measured, and priced beyond it as the curve rose to there), the one with the most
expected tokens per second; a guesser that must read
context first qualifies only once the time it would have saved so far pays for the reading (the
ski-rental rule), and one this answer has not timed yet qualifies whatever its rate (the Book's
price may be stale). One exploration rule measures what the estimates cannot know: a guesser
new to the answer (its first TRIAL_STEPS steps) or switched off for its probe wait (doubled by
each failed probe) takes the step in place of the rule's choice where its worst case fits the
answer's exploration budget. Fixed K is the same rule with K pinned: the planner estimates
nothing then, every guesser rates alike, and the drafter's first offer drafts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from specgen.choices import CATCH_UP_TOKENS, MAX_TREE_ROWS
from specgen.core.step import PLAIN, Plan, Step
from specgen.core.tree import choose_branches

if TYPE_CHECKING:
    from torch import Tensor

    from specgen.core.base import Drafter

FIRST_REACH = 2  # a draft's widest K while no speculative pass is measured (then doubling)
FIRST_STOP = 0.5  # a self-ended draft's stop while its pass is unmeasured: as likely wrong as right
TRIAL_STEPS = 4  # steps a guesser new to the answer (or back after a kept probe) is measured for
PRIOR_ALPHA = 0.7  # an untried guesser's acceptance, where nothing better is known
PRIOR_WEIGHT = 1.0  # draft tokens the target's confidence counts for, as a model's prior
# ... and PRIOR_ALPHA, the prior of a guesser without a stop of its own (prompt lookup): its
# misses come in streaks between long copies, so a few of them say less about the next.
ALPHA_WEIGHT = 2.0
DECAY = 0.9  # per step: the text changes, so old steps count for less
MAX_WAIT = 128  # switched-off steps between probes, at most
READ_SAMPLE = 32  # a read at least this long measures the seconds per token read
RECENT_STEPS = 256  # steps whose tokens and seconds say what a catch-up would save
SPIKE = 2.0  # a pass measured at more than this times its estimate counts as this much
# What exploration may cost an answer, as a share of plain decoding of the tokens asked for:
# a guesser that does not pay leaves plain decoding within a few percent, yet one draft
# model's trial (a prompt's reading, then a few short drafts) fits a hundred-token answer.
EXPLORE_SHARE = 0.025
MIN_BRANCH = 0.02  # a token tree's branch scoring below this is never verified
BRANCH_WEIGHT = 2.0  # branch scores the draft's own odds count for


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens a step with k drafts emits (the accepted prefix plus the target's token)."""
    return k + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def verify_curve(costs: dict[int, float], k: int) -> float:
    """A pass over k+1 tokens from the measured widths: linear between measured neighbours,
    flat beyond the ends. The shape is the hardware's, so it is measured, never assumed; flat
    beyond the widest is optimistic, which gets a self-ended draft's wider passes measured."""
    below, above = [m for m in costs if m < k], [m for m in costs if m > k]
    if k in costs or not below or not above:
        return costs[k if k in costs else max(below) if below else min(above)]
    lo, hi = max(below), min(above)
    return costs[lo] + (costs[hi] - costs[lo]) * (k - lo) / (hi - lo)


def verify_bound(costs: dict[int, float], k: int) -> float:
    """A pass priced for the budget: as verify_curve within the measured widths, rising on
    beyond the widest as it rose from the plain pass (a budget is not spent on optimism)."""
    widest = max(costs)
    if k <= widest or widest == 0 or 0 not in costs:
        return verify_curve(costs, k)
    return costs[widest] + (k - widest) * max(0.0, costs[widest] - costs[0]) / widest


def marginal_verify_cost(costs: dict[int, float]) -> float:
    """Seconds one more draft token adds to a verify pass: the slope over the measured
    speculative widths; 0 until two are measured (wider drafts look free, so get measured)."""
    widths = sorted(k for k in costs if k >= 1)
    if len(widths) < 2:
        return 0.0
    return max(0.0, (costs[widths[-1]] - costs[widths[0]]) / (widths[-1] - widths[0]))


def horizon(made: int, left: int) -> int:
    """Tokens the answer is expected to go on for: as many as it has made (an answer that has
    run n tokens is as likely as not to run n more), never more than are still wanted."""
    return max(0, min(left, made))


def saving(steps: Iterable[tuple[int, float]], rate: float, tokens: int) -> float:
    """Seconds a guesser yielding `rate` would save over `tokens` tokens going as the recent
    `steps` (tokens, seconds) went: only steps slower per token than `rate` save anything."""
    made = spent = 0.0
    for n, seconds in steps:
        made += n
        spent += max(0.0, seconds - n / rate)
    return tokens * spent / made if made and rate > 0.0 else 0.0


def moving_average(old: float | None, new: float) -> float:
    """Costs drift (caches grow, the machine's load changes): recent measurements weigh more."""
    return new if old is None else 0.8 * old + 0.2 * new


def _fold(old: float | None, new: float) -> float:
    """A measurement folded in, one spike (a busy moment, a warm-up) counting as SPIKE times
    the estimate at most: it moves the estimate by a fifth, a lasting change is followed."""
    return moving_average(old, new if old is None else min(new, SPIKE * old))


def record_pass(costs: dict[int, float], k: int, seconds: float) -> None:
    """Fold a target pass over k+1 tokens into `costs`. A narrower pass never costs more than
    a wider one: a plain step measured slow once would otherwise stay so while speculation
    looks better, since only plain steps measure it."""
    costs[k] = _fold(costs.get(k), seconds)
    for width in costs:
        costs[width] = min(costs[width], costs[k]) if width < k else costs[width]


@dataclass
class Estimate:
    """What one guesser is expected to do this answer. Acceptance: decayed draft tokens `kept`
    and drafts `lost` to a rejection, over a `prior` worth `weight` tokens (a draft model's is
    the target's recent top probability: it approximates the target; prompt lookup's
    PRIOR_ALPHA). `draft_cost`: seconds per draft pass (before it is measured, `prior_cost`
    from the Book). `made` and `spent`: tokens and modelled seconds of its self-ended steps.
    `steps`, `idle`, `wait`, `probing`: what the exploration rule reads."""

    ends_own: bool
    prior: float = PRIOR_ALPHA
    weight: float = 0.0  # 0: PRIOR_WEIGHT, or ALPHA_WEIGHT for a guesser without its own stop
    kept: float = 0.0
    lost: float = 0.0
    draft_cost: float | None = None
    prior_cost: float | None = None
    warm: bool = False  # drafted once: a first draft's time includes warming up
    made: float = 0.0
    spent: float = 0.0
    steps: int = 0  # drafted since new to the answer, or since a kept probe
    idle: int = 0  # steps switched off since it last drafted
    wait: int = 0  # switched-off steps before its next probe
    probing: bool = False

    def __post_init__(self) -> None:
        self.wait = self.wait or self.every
        self.weight = self.weight or (PRIOR_WEIGHT if self.ends_own else ALPHA_WEIGHT)

    @property
    def every(self) -> int:
        """Switched-off steps between probes at first: a self-ended probe stops where the draft
        is unsure, so it is cheap and comes four times as often."""
        return 4 if self.ends_own else 16

    @property
    def alpha(self) -> float:
        return (self.kept + self.weight * self.prior) / (self.kept + self.lost + self.weight)

    @property
    def pass_cost(self) -> float:
        return self.draft_cost if self.draft_cost is not None else self.prior_cost or 0.0

    def learn(self, k: int, kept: int, seconds: float, passes: int, ended: bool, verify: float
              ) -> None:
        """After a step it drafted: k tokens, `kept` of them, `seconds` on `passes` draft passes
        (a reading left out; a first draft's time is its warm-up); `ended`: it stopped by itself;
        `verify`: its pass's estimated cost. The yield counts modelled seconds (measured ones
        carry each step's noise). A kept probe says the text has turned: the yield and the
        trial start again from it."""
        if self.warm and passes:
            self.draft_cost = moving_average(self.draft_cost, seconds / passes)
        self.warm = True
        if self.probing and kept:
            self.made = self.spent = 0.0
            self.steps = 0
        if ended:
            self.made = DECAY * self.made + kept + 1
            self.spent = DECAY * self.spent + verify + k * self.pass_cost
        self.kept, self.lost = DECAY * self.kept + kept, DECAY * self.lost + (kept < k)
        self.weight *= DECAY
        self.steps, self.idle = self.steps + 1, 0
        if kept:
            self.wait = self.every
        elif self.probing:
            self.wait = min(2 * self.wait, MAX_WAIT)
        self.probing = False


@dataclass(frozen=True)
class Option:
    """One guesser's best step: `k` drafts stopping below `stop`, expected to make `rate`
    tokens a second, after `read` seconds of reading."""

    guesser: str
    drafter: Drafter
    k: int
    stop: float
    rate: float
    read: float = 0.0


@dataclass
class Book:
    """What a generator measures about its machine that outlives an answer, to price a guesser
    before its first draft of the next: a guesser's seconds per token read (`read_share`) and
    per draft pass (`draft_share`), both per second of the target's plain pass, and the
    target's seconds per prompt token (`prefill_cost`). Invariant: a cost only drafting
    measures is kept as a share of one every answer measures afresh, never in seconds: a busy
    spell slows draft and target alike, and a guesser priced too dear is never started, so
    never measured again."""

    read_share: dict[str, float] = field(default_factory=dict)
    prefill_cost: float | None = None
    draft_share: dict[str, float] = field(default_factory=dict)
    warm: set[str] = field(default_factory=set)  # guessers that have read once
    target_size: int | None = None  # the target's layers' multiply-adds per token

    def catch_up(self, guesser: str, unread: int, plain_pass: float | None = None,
                 size: int | None = None) -> float:
        """Seconds `guesser` would read `unread` tokens for (0 for a pass's worth, or while
        nothing is measured). Unmeasured, the target's prompt pass stands in, scaled by the
        guesser's draft pass against the target's or else its `size` against the target's,
        at most 1: priced as the target, a small draft would never read where it pays. A
        prompt token never costs more than the target's one-token pass: a prompt pass found
        slower (a kernel compiled inside it, pages read from disk) was slow once."""
        if unread < CATCH_UP_TOKENS:
            return 0.0
        share = self.read_share.get(guesser)
        if share is not None and plain_pass:
            return unread * share * plain_pass
        if self.prefill_cost is None:
            return 0.0
        scale = self.draft_share.get(guesser)
        if scale is None and size and self.target_size:
            scale = size / self.target_size
        per_token = min(self.prefill_cost, plain_pass or self.prefill_cost)
        return unread * per_token * min(1.0, 1.0 if scale is None else scale)

    def read(self, guesser: str, tokens: int, seconds: float, plain_pass: float | None) -> None:
        """A catch-up of `tokens` took `seconds`; a guesser's first read is its warm-up."""
        if guesser not in self.warm:
            self.warm.add(guesser)
        elif tokens >= READ_SAMPLE and plain_pass:
            self.read_share[guesser] = _fold(self.read_share.get(guesser),
                                             seconds / tokens / plain_pass)

    def drafted(self, guesser: str, seconds: float, plain_pass: float | None) -> None:
        if plain_pass:
            self.draft_share[guesser] = seconds / plain_pass

    def prefilled(self, tokens: int, seconds: float) -> None:
        if tokens >= READ_SAMPLE:
            self.prefill_cost = moving_average(self.prefill_cost, seconds / tokens)


class Planner:
    """The rule beside the loop: `plan` before a step, `observe` after it. One per answer; the
    generator's `book` outlives it."""

    def __init__(self, k_max: int, adaptive: bool = True, book: Book | None = None) -> None:
        self.k_max, self.adaptive = k_max, adaptive
        self.book = Book() if book is None else book
        self.verify_cost: dict[int, float] = {}
        self.estimates: dict[str, Estimate] = {}
        self.steps: deque[tuple[int, float]] = deque(maxlen=RECENT_STEPS)  # (tokens, seconds)
        self.confidence: float | None = None  # the target's recent top probability
        self.explored = 0.0  # seconds exploration cost beyond plain steps, this answer
        self.branch_record = (0, 0.0)  # token trees: branches kept, their summed scores
        self.branch_offer = 0.0  # the summed scores of the last tree's branches

    @property
    def reads_confidence(self) -> bool:
        """Whether `sure` is read: a guesser that ends its own drafts takes it as its prior,
        where the planner estimates at all (adaptive, with something to draft)."""
        return self.adaptive and self.k_max > 0

    def prefilled(self, tokens: int, seconds: float) -> None:
        """The target's pass over `tokens` prompt tokens took `seconds`."""
        self.book.prefilled(tokens, seconds)

    def sure(self, probability: float) -> None:
        """The target's top probability at a step's first position: how predictable the text is."""
        self.confidence = moving_average(self.confidence, probability)

    def estimate(self, guesser: str, drafter: Drafter) -> Estimate:
        """The guesser's estimate, made on first use, its priors refreshed from this answer."""
        est = self.estimates.setdefault(guesser, Estimate(drafter.ends_own_drafts))
        share, plain = self.book.draft_share.get(guesser), self.verify_cost.get(0)
        if share is not None and plain is not None:
            est.prior_cost = share * plain
        if est.ends_own and self.confidence is not None:
            est.prior = self.confidence
        return est

    def catch_up(self, guesser: str, drafter: Drafter, tokens: Tensor) -> float:
        """Seconds `drafter` would read before guessing for `guesser`."""
        return self.book.catch_up(guesser, drafter.unread(tokens), self.verify_cost.get(0),
                                  drafter.size)

    def rate(self, est: Estimate, k: int) -> float:
        """Expected tokens per second of k drafts at the estimate's acceptance and costs. A
        guesser that does not end its own drafts pays for a width beyond the widest measured
        as the curve rose to there (verify_bound): it goes that wide only where its acceptance
        says so, not because an unmeasured width looks free. A self-ended draft's K is its
        stop's, so the flat guess only gets its wider passes measured."""
        curve = verify_curve if est.ends_own else verify_bound
        cost = curve(self.verify_cost, k) + k * est.pass_cost
        return expected_tokens(est.alpha, k) / max(cost, 1e-9)

    def option(self, guesser: str, drafter: Drafter, top: int, tokens: Tensor | None = None
               ) -> Option:
        """The guesser's best K up to `top`. A guesser that ends its own drafts drafts `top` with
        a stop, at its measured yield (untried: the best K's rate), unless a fixed K is
        expected to do better (its probabilities may say far less than its acceptance does)."""
        est = self.estimate(guesser, drafter)
        if not est.ends_own:
            top = min(top, self.reach())
        rates = {k: self.rate(est, k) for k in range(1, top + 1)}
        k = max(rates, key=rates.__getitem__)
        best = Option(guesser, drafter, k, 0.0, rates[k], self.catch_up(guesser, drafter, tokens))
        if est.ends_own:
            ended = est.made / est.spent if est.spent else best.rate
            if ended >= best.rate:
                best = replace(best, k=top, stop=self._stop(est, ended), rate=ended)
        return best

    def reach(self) -> int:
        """The widest draft a guesser that does not end its own may take: twice the widest
        pass measured (2 at first). Beyond the widest the curve is flat, so optimistic, and a
        wrong guess costs a whole wide pass; widths measured in doublings also keep the
        linear steps between measured neighbours close to a curve that bends upwards."""
        return max(FIRST_REACH, 2 * max(self.verify_cost, default=0))

    def _stop(self, est: Estimate, rate: float) -> float:
        """A self-ended draft goes on while one more token, kept with at most the draft's
        probability of all so far, pays for a draft pass and a wider verify at the better of
        this rate and a plain step's."""
        if est.draft_cost is None:
            return FIRST_STOP
        best = max(rate, 1.0 / self.verify_cost[0])
        return best * (est.draft_cost + marginal_verify_cost(self.verify_cost))

    def plan(self, drafter: Drafter, tokens: Tensor, limit: int, made: int = 0) -> Plan:
        """The next step's plan, drafting at most `limit` tokens, `made` tokens into the answer."""
        top = min(self.k_max, limit)
        if top < 1:  # nothing to draft: no guesser is asked (prompt lookup searches the text)
            return PLAIN
        offered = drafter.guessers(tokens)
        if not offered:
            return PLAIN
        if not self.adaptive:
            guesser, who = next(iter(offered.items()))
            return Plan(guesser, who, top)
        if 0 not in self.verify_cost:  # the cost speculation has to beat, measured first
            return PLAIN
        options = [self.option(g, who, top, tokens) for g, who in offered.items()]
        plain = 1.0 / self.verify_cost[0]
        ahead = horizon(made, limit + 1)
        # A guesser this answer has not timed drafts even where its rate says otherwise: the
        # Book's price is from earlier answers, and a guesser priced too dear that way would
        # never be timed again.
        worth = [o for o in options
                 if (o.rate > plain or self.estimates[o.guesser].draft_cost is None)
                 and (o.read <= 0.0 or saving(self.steps, o.rate, ahead) > o.read)]
        chosen = max(worth, key=lambda o: o.rate, default=None)
        for o in options:
            est = self.estimates[o.guesser]
            est.probing = False
            est.idle += o.rate <= plain
        look = self._explore(options, chosen, made + limit + 1, top)
        if look is not None:
            return look
        return PLAIN if chosen is None else Plan(chosen.guesser, chosen.drafter, chosen.k,
                                                 chosen.stop)

    def _explore(self, options: list[Option], chosen: Option | None, asked: int, top: int
                 ) -> Plan | None:
        """The first guesser due a look, where its worst case fits the budget: switched off for
        its wait (a probe), or, where the step would be plain, new to the answer or back after
        a kept probe (a trial: a prior can be wrong both ways). A guesser that ends its own
        drafts is asked for one, which stops where it is unsure; another probes one token."""
        budget = EXPLORE_SHARE * self.verify_cost[0] * asked - self.explored
        for o in options:
            est = self.estimates[o.guesser]
            probe = est.idle >= est.wait
            if o is chosen or not (probe or est.steps < TRIAL_STEPS and chosen is None):
                continue
            k = top if est.ends_own else 1 if probe else o.k
            k = self._afford(est, k, o.read, budget)
            if k:
                est.probing, est.idle = probe, 0 if probe else est.idle
                stop = self._stop(est, o.rate) if est.ends_own else 0.0
                return Plan(o.guesser, o.drafter, k, stop, explore=True)
        return None

    def _afford(self, est: Estimate, k: int, read: float, budget: float) -> int:
        """The largest K up to k whose step fits `budget` at its worst: the reading, k draft
        passes (unmeasured, as dear as the target's) and the wider pass, nothing kept."""
        plain = self.verify_cost[0]
        draft = est.draft_cost if est.draft_cost is not None else est.prior_cost or plain
        for width in range(k, 0, -1):
            wider = max(0.0, verify_bound(self.verify_cost, width) - plain)
            if read + width * draft + wider <= budget:
                return width
        return 0

    def branches(self, scores: Tensor, tokens: Tensor, k: int) -> list[tuple[int, int]]:
        """The branches a chain of k drafts gets (tree.choose_branches): each worth its score in
        tokens, scaled by how the draft's odds have held, against one more row of the verify
        pass at the measured slope, a token worth what one takes at the recent steps' rate."""
        if not self.adaptive or not self.steps:
            return []
        seconds_per_token = sum(s for _, s in self.steps) / sum(n for n, _ in self.steps)
        floor = marginal_verify_cost(self.verify_cost) / seconds_per_token / self.branch_odds
        chosen = choose_branches(scores, tokens, max(floor, MIN_BRANCH), MAX_TREE_ROWS - 1 - k)
        self.branch_offer = sum(score for _, _, score in chosen)
        return [(index, token) for index, token, _ in chosen]

    @property
    def branch_odds(self) -> float:
        """Branches kept per unit of their scores (the draft's own odds say 1)."""
        hits, offered = self.branch_record
        return (hits + BRANCH_WEIGHT) / (offered + BRANCH_WEIGHT)

    def observe(self, step: Step) -> None:
        """After a step (core/step.py): its verify pass's cost, what it kept, its drafts' cost.
        A drafter's reading of context before drafting is measured apart (`catch_up`)."""
        plan, k = step.plan, step.drafted
        draft_seconds, verify_seconds = step.draft_seconds, step.verify_seconds
        if plan.explore and 0 in self.verify_cost:  # beyond the plain steps its tokens would take
            spent = draft_seconds + verify_seconds - (step.kept + 1) * self.verify_cost[0]
            self.explored += max(0.0, spent)
        record_pass(self.verify_cost, step.width, verify_seconds)
        if step.tree is not None:
            hits, offered = self.branch_record
            self.branch_record = (hits + step.branch_kept, offered + self.branch_offer)
        read, read_seconds = plan.drafter.catch_up if k else (0, 0.0)
        passes = k
        if read >= CATCH_UP_TOKENS:
            self.book.read(plan.guesser, read, read_seconds, self.verify_cost.get(0))
            draft_seconds, passes = max(0.0, draft_seconds - read_seconds), k - 1
        self.steps.append((step.kept + 1, draft_seconds + verify_seconds))
        if not k:
            return
        est = self.estimate(plan.guesser, plan.drafter)
        # The draft is judged on its chain: a branch's token is the tree's, paid by its rows.
        est.learn(k, step.chain_kept, draft_seconds, passes, plan.stop_below > 0.0,
                  verify_curve(self.verify_cost, k))
        if est.draft_cost is not None:
            self.book.drafted(plan.guesser, est.draft_cost, self.verify_cost.get(0))
