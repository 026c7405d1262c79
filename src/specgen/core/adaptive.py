"""Choosing K each step: the number of draft tokens that maximises expected tokens per second.

With per-token acceptance rate alpha, a step that drafts K tokens yields on average
(1 - alpha^(K+1)) / (1 - alpha) tokens and costs K draft passes plus one target pass over
K+1 tokens. Both costs are measured as the run goes. K = 0 is plain target decoding, so
speculation that does not pay switches itself off; after `probe_every` plain steps a
one-token draft probes whether the draft has become useful again. Each failed probe doubles
the wait (up to `max_probe_every`), so text the draft cannot guess costs few probes; a kept
draft resets it. Rejections while speculation is on leave the wait alone: they say nothing
about how soon after switching off the draft may be worth another try.

Several guessers (a hybrid's prompt lookup and draft model) each get a policy of their own,
since their costs and acceptance differ; each step goes to the one with the best expected
rate. The target's pass costs are the target's, whoever drafted: the policies share them.

A draft model knows how sure it is of each token, and the chance that a drafted prefix
survives verification is about the product of its probabilities. So its policy offers it
k_max and a threshold (`stop_below`) instead of one K for every step: the draft goes on
while one more token could still pay for itself, which is long in boilerplate and short
where the text turns. Whether to speculate at all is then decided on the measured yield of
such drafts (tokens per second of their steps) against a plain step, and probes are
self-ended drafts too: no model of a draft whose length it does not choose. Such a probe
stops where the draft is unsure, so it is cheap and comes after 4 plain steps, not 16.

Until a guesser has drafted, its acceptance is a prior. A draft model (any guesser that ends
its own drafts: a smaller model, a head, the target with layers skipped) approximates the
target, so it picks the target's token about as often as the target is sure of it: its
prior is the target's recent top probability (`Planner.sure`, read with each step's
outcome). In code or JSON that is near one, and the draft is expected to pay well; in prose
it is lower. Prompt lookup copies the context, and how sure the target is says nothing of
whether the text repeats: its prior is PRIOR_ALPHA. Either prior fades as guesses are kept
or rejected.

Between guessers, each step goes to the best measured yield (tokens per second of the
guesser's own steps; the expected rate of its K until it has drafted a few times), except
that a switched-off guesser's probe takes its step: its yield is measured only on the steps
it drafts, so a hybrid's draft model switched off early would otherwise never be asked again
while prompt lookup's free guesses outscore its old yield.

A guesser may have to read context before it can guess: a draft model reads the prompt
when first asked to draft, and catches up on what other guessers drafted. That reading is
paid before any of its guesses, and whether they will be worth it on this text is not known
until they are made; nor how long the answer will be. So a guesser with reading to do is
asked only once the time it would have saved on the answer so far, at its expected rate,
pays for the reading (`saving`; the ski-rental rule): an answer that ends sooner never
pays for it, and one that goes on pays at most twice what starting at once would have.
Steps that already made tokens faster than it would (prompt lookup copying a passage) save
it nothing, so on a long prompt lookup drafts first and the draft model joins where plain
steps or poor guesses leave it something to save. What reading costs per token, and what a
draft pass costs, are measured on this machine and kept across answers as shares of the
target's plain pass (`Book`), which each answer measures first: a busy spell of the machine
slows both, and must not price the draft out of every later answer. Until then the
target's own prompt pass stands in for the reading, scaled by what a draft pass costs
against a plain one (a draft reads no slower than its target); a guesser's first read,
with its warm-up, is not measured. A probe of a switched-off guesser pays its reading: that
is part of asking.

A prior can be wrong both ways: a draft whose guesses the target keeps while the target is
unsure of them (random weights, open-ended prose argmax-agreeing with a close draft) would
never be started on the prior alone, so it would never be measured. So the planner tries
a guesser before it believes its prior: where the step would otherwise be plain, an
untried guesser drafts its trial steps (TRIAL_STEPS for a self-ended draft), and then only
what they measured decides, as for any guesser. Trials and probes are exploration, and
an answer spends at most EXPLORE_SHARE of what plain decoding of the tokens asked for
would take on them, counted as the seconds they took beyond the plain steps their tokens
would have taken, priced beforehand at the worst (nothing kept; an unmeasured draft pass
as dear as the target's): a step that would not fit is shortened, or not taken.

A self-ended draft stops by its own probabilities, which are not the odds that the target
keeps its guesses: a draft may agree with the target's argmax far more often than its
probabilities say. Once its first drafts have measured the acceptance, the same draft run
at the best fixed K for that acceptance (its stop left out) is expected to yield as the
geometric model says; where that beats the self-ended drafts' measured yield, it drafts
so. From then on the fixed K's way is judged by the geometric model at the acceptance and
costs its own drafts measured (a step's acceptance is far less noisy than its yield), the
self-ended way by its yield; the fixed K, where it looks worse, is retried at doubling
intervals.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from specgen.choices import CATCH_UP_TOKENS, MAX_TREE_ROWS
from specgen.core.step import PLAIN, Plan, Step
from specgen.core.tree import choose_branches

if TYPE_CHECKING:
    from torch import Tensor

    from specgen.core.drafters import Drafter


FIRST_K = 2  # a guesser's K while its costs are unknown
FIRST_STOP = 0.5  # a self-ended draft's stop then: its whole draft as likely wrong as right
TRIAL_STEPS = 4  # a self-ended draft's first steps, taken before its yield is judged
YIELD_STEPS = 2  # steps after which a guesser is compared with others by its measured yield
READ_SAMPLE = 32  # a read at least this long measures the seconds per token read
RECENT_STEPS = 256  # steps whose tokens and seconds say what a catch-up would save
PRIOR_ALPHA = 0.7  # an untried guesser's acceptance, where nothing better is known
PRIOR_WEIGHT = 2.0  # draft tokens the prior acceptance counts for
# What exploration (a guesser's trial steps taken against its prior, and probes) may cost
# an answer, as a share of the time plain decoding of the tokens asked for would take:
# small enough that a guesser that does not pay leaves plain decoding within a few percent,
# large enough for a trial of one draft model (its reading of a prompt about a pass's cost,
# then a few short drafts) in an answer of a hundred tokens or so.
EXPLORE_SHARE = 0.025
# A token tree's branch scoring below this (by the draft's odds, the chance it is the
# target's token) is never verified, however cheap a row looks.
MIN_BRANCH = 0.02


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens emitted by a step with k drafts (accepted prefix plus one target token)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def verify_curve(costs: dict[int, float], k: int) -> float:
    """Cost of a pass over k+1 tokens for an unmeasured k, from the measured widths: linear
    between the two measured neighbours, flat beyond the ends. The shape is the hardware's
    (flat up to K≈8 in bf16 on a CPU with bf16 units; on an AVX2 CPU in fp32 a jump from
    one token to two, then slowly rising), so it is measured, never assumed; flat beyond the
    widest measured pass is optimistic, which is what makes the policy try wider drafts."""
    below = [m for m in costs if m < k]
    above = [m for m in costs if m > k]
    if not below or not above:
        return costs[max(below) if below else min(above)]
    lo, hi = max(below), min(above)
    return costs[lo] + (costs[hi] - costs[lo]) * (k - lo) / (hi - lo)


def verify_bound(costs: dict[int, float], k: int) -> float:
    """A pass over k+1 tokens priced for a budget: as verify_curve within the measured
    widths; beyond the widest, rising on as it rose from the plain pass to there (not flat:
    a budget must not be spent on the optimism that gets wider drafts measured)."""
    widest = max(costs)
    if k <= widest or widest == 0 or 0 not in costs:
        return verify_curve(costs, k)
    return costs[widest] + (k - widest) * max(0.0, costs[widest] - costs[0]) / widest


def marginal_verify_cost(costs: dict[int, float]) -> float:
    """Seconds one more draft token adds to a verify pass: the slope between the narrowest
    and the widest measured speculative passes; 0 until two widths are measured (wider
    drafts then look free, which gets them measured)."""
    widths = sorted(k for k in costs if k >= 1)
    if len(widths) < 2:
        return 0.0
    lo, hi = widths[0], widths[-1]
    return max(0.0, (costs[hi] - costs[lo]) / (hi - lo))


def horizon(made: int, left: int) -> int:
    """Tokens the answer is expected to go on for: as many as it has made so far (an answer
    that has run for n tokens is as likely as not to run for n more), never more than the
    tokens still wanted."""
    return max(0, min(left, made))


def saving(steps: Iterable[tuple[int, float]], rate: float, tokens: int) -> float:
    """Seconds a guesser yielding `rate` would save over the next `tokens` tokens, if they
    go as the recent `steps` (tokens made, seconds) went: each step slower per token than
    `rate` would have taken tokens / rate instead. With `tokens` the horizon, a catch-up
    is started once the time it would have saved so far pays for it (the ski-rental
    rule): an answer that ends sooner never pays for it, one that goes on pays at most
    twice what starting at once would have."""
    made = spent = 0.0
    for n, seconds in steps:
        made += n
        spent += max(0.0, seconds - n / rate)
    return tokens * spent / made if made and rate > 0.0 else 0.0


def moving_average(old: float | None, new: float) -> float:
    """Costs drift (caches grow, the machine's load changes): weight recent measurements."""
    return new if old is None else 0.8 * old + 0.2 * new


SPIKE = 2.0  # a pass measured at more than this times its estimate counts as this much


def _fold(old: float | None, new: float) -> float:
    """A measurement folded into a kept estimate, one spike counting for at most SPIKE
    times the estimate (a busy moment, a first call warming up)."""
    return moving_average(old, new if old is None else min(new, SPIKE * old))


def record_pass(costs: dict[int, float], k: int, seconds: float) -> None:
    """Fold one measured target pass over k+1 tokens into `costs`. Two invariants keep one
    slow pass (the machine busy for a moment, a first call warming up) from deciding many
    steps: a measurement counts for at most SPIKE times the estimate, so one spike moves it
    by a fifth at most while a lasting change is still followed within a few passes; and a
    pass over fewer tokens costs no more than one over more, so a narrower width's estimate
    above this one is lowered to it. Without the second, a plain step's cost inflated once
    would stay so for as long as speculation looks better than it: plain steps, the only
    ones that measure it, would not be taken again."""
    costs[k] = _fold(costs.get(k), seconds)
    for width in costs:
        if width < k and costs[width] > costs[k]:
            costs[width] = costs[k]


class Policy(Protocol):
    probing: bool  # the step planned is a probe of a switched-off guesser
    judging: bool  # the step planned is still finding out (adaptive K)
    draft_cost: float | None  # seconds per draft pass, this answer (None: not measured)

    def choose(self, limit: int) -> int: ...

    def rate(self, k: int) -> float: ...

    def score(self, k: int) -> float: ...

    def update(self, k: int, n_accepted: int, draft_seconds: float, passes: int | None = None
               ) -> None: ...

    def stop_below(self, k: int) -> float: ...


def choose_guesser(policies: Mapping[str, Policy], guessers: Sequence[str], limit: int,
                   catch_up: Mapping[str, float] | None = None,
                   saved: Callable[[float], float] | None = None,
                   explore: Callable[[str, int], int | None] | None = None,
                   ) -> tuple[str | None, int]:
    """Of the `guessers` whose policy drafts this step, the one with the best score (the
    first of equals), with its K; (None, 0) when none drafts: a plain step. A switched-off
    guesser's probe comes before every score: a probe is there to measure, and a guesser
    measured only when it outscores the others would keep the poor yield that switched it
    off for the rest of the answer, however its guesses would do now. A guesser with
    `catch_up` seconds of reading to do first drafts only where `saved(its score)`, the
    seconds it is expected to save, is more (a probe excepted): where other guessers
    already make tokens about as fast, it has nothing to repay its reading with.
    `explore(guesser, k)` says whether a guesser's step would be exploration (None: it is
    not) and the K it can afford (0: none, the guesser sits the step out); exploration is
    taken as a probe is."""
    best: tuple[str | None, int] = (None, 0)
    best_key = (False, -math.inf)
    for guesser in guessers:
        policy = policies[guesser]
        k = policy.choose(limit)
        if not k:
            continue
        score = policy.score(k)
        seconds = (catch_up or {}).get(guesser, 0.0)
        probe = policy.probing
        afford = explore(guesser, k) if explore is not None else None
        if afford is not None:
            if not afford:
                continue
            k, probe = afford, True
        if seconds > 0.0 and not probe and (saved is None or saved(score) <= seconds):
            continue
        if (probe, score) > best_key:
            best, best_key = (guesser, k), (probe, score)
    return best


class FixedK:
    """Always K (adaptive off): it never probes, never judges, measures no draft cost."""

    probing = judging = False
    draft_cost = None

    def __init__(self, k: int) -> None:
        self.k_max = k

    def choose(self, limit: int) -> int:
        return min(self.k_max, limit)

    def rate(self, k: int) -> float:
        return 0.0  # no estimate: guessers keep their order of preference

    def score(self, k: int) -> float:
        return 0.0

    def update(self, k: int, n_accepted: int, draft_seconds: float, passes: int | None = None
               ) -> None:
        pass

    def stop_below(self, k: int) -> float:
        return 0.0  # K is K


class AdaptiveK:
    """Pick K in [0, k_max] from the running acceptance rate and measured costs.
    `self_stopping`: the guesser ends its drafts itself at `stop_below` (a draft model), so
    when speculation pays it is offered k_max."""

    def __init__(
        self, k_max: int, decay: float = 0.9, prior_alpha: float = PRIOR_ALPHA,
        probe_every: int | None = None, max_probe_every: int = 128,
        verify_cost: dict[int, float] | None = None, self_stopping: bool = False,
        prior_draft_cost: float | None = None,
    ) -> None:
        self.k_max = k_max
        self.self_stopping = self_stopping
        self.decay = decay
        if probe_every is None:
            # A self-ended probe stops where the draft is unsure, so it costs little: it can
            # come four times as often.
            probe_every = 4 if self_stopping else 16
        self.probe_every, self.max_probe_every = probe_every, max_probe_every
        self.wait = probe_every  # plain steps before the next probe
        # Decayed counts of accepted / rejected draft tokens, and a weak prior of
        # PRIOR_WEIGHT tokens at `prior_alpha`, decayed as they are: the prior may change
        # while it still counts (a draft model's follows the target's confidence).
        self.hits = self.misses = 0.0
        self.prior_alpha, self.prior_weight = prior_alpha, PRIOR_WEIGHT
        self.draft_cost: float | None = None  # seconds per draft forward, this answer
        self.prior_draft_cost = prior_draft_cost  # the same, from earlier answers
        self.warm = False  # drafted once: the first step's cost includes warming up
        # Seconds per target pass over k+1 tokens, shared by the policies of one generation.
        self.verify_cost = {} if verify_cost is None else verify_cost
        self.plain_steps = 0
        self.probing = False  # the step in flight is a probe
        # A guesser's yield is measured, not modelled (a self-ended draft's length varies
        # with the text; lookup's guesses hold in runs): decayed tokens made and seconds
        # spent by its speculative steps.
        self.yield_tokens = self.yield_seconds = 0.0
        self.spec_steps = 0  # speculative steps taken
        # A self-ended draft may also run at a fixed K, its stop left out (`fixed`: the step
        # in flight does). Each way's measurements over the answer (`ways`, by `fixed`;
        # never decayed, the two being compared on the same text): tokens made, seconds,
        # draft tokens kept, drafts cut short, tokens drafted.
        self.fixed = False
        self.ways = {False: [0.0, 0.0, 0, 0, 0], True: [0.0, 0.0, 0, 0, 0]}
        # Self-ended steps before the fixed K is tried again where it looked worse: a few
        # unlucky drafts must not rule it out for the answer (its acceptance, no longer
        # measured, would never recover). Doubled by each retry that still looks worse.
        self.fixed_wait, self.since_fixed = probe_every, 0
        self.since_probe = YIELD_STEPS  # steps since a kept probe started the yield again
        self.trial_over = False  # ended early by the planner's budget

    @property
    def alpha(self) -> float:
        prior = self.prior_weight
        return (self.hits + prior * self.prior_alpha) / (self.hits + self.misses + prior)

    def _verify_cost(self, k: int) -> float:
        if k in self.verify_cost:
            return self.verify_cost[k]
        return verify_curve(self.verify_cost, k)

    def _draft_cost(self) -> float:
        if self.draft_cost is not None:
            return self.draft_cost
        return self.prior_draft_cost or 0.0

    def way_alpha(self, fixed: bool) -> float:
        """The acceptance one way's drafts showed over the answer, the prior left out. The
        fixed K's starts from the self-ended drafts' (worth PRIOR_WEIGHT tokens): where the
        draft stops where unsure, its self-ended guesses are kept more often than a fixed
        K's would be, and the fixed K's own drafts correct that."""
        _, _, kept, lost, _ = self.ways[False]
        ended = kept / (kept + lost) if kept + lost else 0.0
        if not fixed:
            return ended
        _, _, kept, lost, _ = self.ways[True]
        return (kept + PRIOR_WEIGHT * ended) / (kept + lost + PRIOR_WEIGHT)

    def _geometric_rate(self, k: int, alpha: float | None = None) -> float:
        cost = self._verify_cost(k) + k * self._draft_cost()
        return expected_tokens(self.alpha if alpha is None else alpha, k) / max(cost, 1e-9)

    def _fixed_k(self, top: int) -> int:
        """The fixed K a self-ended draft would run at: the best for the measured acceptance."""
        alpha = self.way_alpha(True)
        return max(range(1, top + 1), key=lambda k: self._geometric_rate(k, alpha))

    def _fixed_rate(self, k: int) -> float:
        """What a self-ended draft is expected to yield at a fixed K of at most k, its stop
        left out: the geometric model's at that way's measured acceptance and costs (the
        acceptance of a step is far less noisy than its yield: one long draft rejected at
        its first token would otherwise rule the way out); nothing before YIELD_STEPS
        self-ended drafts (since the last kept probe)."""
        tokens, _, kept, _, _ = self.ways[False]
        if tokens - kept < YIELD_STEPS:  # its steps: each made its kept tokens and one more
            return 0.0
        return self._geometric_rate(self._fixed_k(k), self.way_alpha(True))

    def _ended_rate(self) -> float:
        tokens, seconds, _, _, _ = self.ways[False]
        return tokens / seconds if seconds else 0.0

    @property
    def judging(self) -> bool:
        """The step planned is still finding out: a kept probe has started the yield again
        and too few steps have followed for it to be more than that probe's luck, or it is
        the first at a fixed K since."""
        return self.since_probe < YIELD_STEPS or (self.fixed and not self.ways[True][0])

    def end_trial(self) -> None:
        """Its trial is over before TRIAL_STEPS: what it has measured decides from now."""
        self.trial_over = True

    def trial(self, limit: int) -> int:
        """The K of a step that would be part of this guesser's trial (0: its trial is
        over, or a plain step must come first): what measures it before its prior is
        believed."""
        top = min(self.k_max, limit)
        if not top or 0 not in self.verify_cost or self.trial_over:
            return 0
        if self.self_stopping:
            return top if self.spec_steps < TRIAL_STEPS else 0
        return min(top, FIRST_K) if self.draft_cost is None else 0

    def rate(self, k: int) -> float:
        """Expected tokens per second when drafting k tokens. An untried guesser is taken
        to guess at the prior acceptance, at the draft cost measured in earlier answers
        (free when there were none): it gets a step to be measured only where the others
        are expected to do worse than that. An untried self-ended draft is taken to do as
        well as the best fixed K would; a measured one, as the better of its two ways."""
        if not self.verify_cost:
            return math.inf  # nothing measured yet
        if k and self.self_stopping:
            if self.yield_seconds:  # measured; or the fixed K's model, until it has drafted
                untried = 0.0 if self.ways[True][0] else self._fixed_rate(k)
                return max(self.yield_tokens / self.yield_seconds, untried)
            return max(self._geometric_rate(j) for j in range(1, k + 1))
        return self._geometric_rate(k)

    def score(self, k: int) -> float:
        """What this guesser is expected to yield a step, to compare it with the others: its
        measured yield once it has drafted YIELD_STEPS times, else the expected rate of k."""
        if self.spec_steps >= YIELD_STEPS and self.yield_seconds:
            return self.rate(k) if self.self_stopping else self.yield_tokens / self.yield_seconds
        return self.rate(k)

    def choose(self, limit: int) -> int:
        self.probing = False  # a probe offered last step but not taken is forgotten
        self.fixed = False
        top = min(self.k_max, limit)
        if top == 0 or 0 not in self.verify_cost:
            # A plain step first: the cost speculation has to beat, never assumed; and an
            # answer that ends here never pays for the draft reading the prompt.
            return 0
        if self.draft_cost is None:
            # Then short speculative steps: cheap if the draft is useless, and wider drafts
            # look cheap until measured (verify_curve). A self-ended draft is short where
            # it is unsure by itself, and long where it is sure (a passage to copy).
            return top if self.self_stopping else min(top, FIRST_K)
        if self.self_stopping and self.spec_steps < TRIAL_STEPS and not self.trial_over:
            # The yield of two or three steps is noise: one confidently wrong draft would
            # switch off a draft that pays. It may be run at a fixed K meanwhile, where that
            # is longer than its drafts have been (it stops too soon for what is kept).
            return self._way(top, longer=True) if self.spec_steps >= YIELD_STEPS else top
        best = max(range(top + 1), key=self.rate)
        if best == 0:
            self.plain_steps += 1
            if self.plain_steps >= self.wait:
                self.plain_steps = 0
                self.probing = True
                # The cheapest probe: does the draft guess the next token? A self-ended
                # draft is its own probe: it stops where its guesses stop paying.
                return top if self.self_stopping else 1
        if best and self.self_stopping:
            return self._way(top)
        return best

    def _way(self, top: int, longer: bool = False) -> int:
        """A self-ended draft's K, by the better way: the draft's probabilities may say far
        less than the acceptance its first drafts measured (then the fixed K's). A way
        that looks worse is retried after `fixed_wait` steps, as a switched-off draft is
        probed."""
        tokens, _, kept, _, drafted = self.ways[False]
        steps = tokens - kept  # each step made its kept tokens and one more
        expected = self._fixed_rate(top)
        k = self._fixed_k(top)
        self.fixed = expected > self._ended_rate() and (not longer or k * steps > drafted)
        if self.fixed:
            self.fixed_wait, self.since_fixed = self.probe_every, 0
        elif expected:
            self.since_fixed += 1
            if self.since_fixed >= self.fixed_wait:  # a retry, one token longer than usual
                self.fixed, self.since_fixed = True, 0
                self.fixed_wait = min(2 * self.fixed_wait, self.max_probe_every)
                k = min(k, math.ceil(drafted / steps) + 1)
        return k if self.fixed else top

    def stop_below(self, k: int) -> float:
        """End a self-ended draft once the draft's probability of every token so far
        falls below this. The next token would add at most that probability in expected
        tokens, for a draft pass and a wider verify pass: worth it only while that is more
        than those seconds yield at the better of drafting and plain steps. Until those
        costs are measured: FIRST_STOP."""
        if not self.self_stopping or self.fixed:
            return 0.0
        if self.draft_cost is None or not self.verify_cost:
            return FIRST_STOP
        rate = max(self.rate(k), self.rate(0))
        return rate * (self.draft_cost + marginal_verify_cost(self.verify_cost))

    def update(self, k: int, n_accepted: int, draft_seconds: float, passes: int | None = None
               ) -> None:
        """After a step this policy drafted (k >= 1); the pass itself goes to record_pass.
        `draft_seconds` were spent on `passes` draft passes (default k), a catch-up left
        out (the planner charges it apart). The first step's drafting time is not a cost
        of drafting: it includes first-call warm-up, and taken as the cost it would switch
        a good draft off."""
        passes = k if passes is None else passes
        if self.warm and passes:
            self.draft_cost = moving_average(self.draft_cost, draft_seconds / passes)
        self.warm = True
        # A kept probe says the text has changed since speculation went off: the yield
        # starts again from it, or a long bad stretch would outvote it for many probes.
        # The first step's draft time is unknown: taken as free.
        self.spec_steps += 1
        seconds = self._verify_cost(k) + k * self._draft_cost()
        keep = 0.0 if self.probing and n_accepted else self.decay
        self.yield_tokens = keep * self.yield_tokens + n_accepted + 1
        self.yield_seconds = keep * self.yield_seconds + seconds
        if not keep:  # a kept probe: each way's measurements start again, as the yield does
            self.ways = {False: [0.0, 0.0, 0, 0, 0], True: [0.0, 0.0, 0, 0, 0]}
            self.fixed_wait, self.since_fixed = self.probe_every, 0
            self.since_probe = 0
        self.since_probe += 1
        way = self.ways[self.fixed]  # each way of drafting is judged by its own yield
        way[0] += n_accepted + 1
        way[1] += seconds
        way[2] += n_accepted
        way[3] += n_accepted < k
        way[4] += k
        if n_accepted:
            self.wait = self.probe_every
        elif self.probing:  # a failed probe: wait twice as long before the next
            self.wait = min(2 * self.wait, self.max_probe_every)
        self.probing = self.fixed = False
        rejected = 1.0 if n_accepted < k else 0.0
        self.hits = self.decay * self.hits + n_accepted
        self.misses = self.decay * self.misses + rejected
        self.prior_weight *= self.decay


@dataclass
class Book:
    """What a generator measures about its machine that outlives one answer: the seconds per
    token a guesser's catch-up reads (`read_share`, by guesser) and a guesser's seconds per
    draft pass (`draft_share`), both per second of the target's plain pass, and the target's
    seconds per prompt token (`prefill_cost`). These are needed before a guesser's first
    draft of an answer, to price what starting it would cost.

    Invariant: a cost that only drafting measures outlives an answer as a share of one that
    every answer measures afresh (its first step is a plain one), never in seconds. A
    stretch of a busy machine (another job, a throttled CPU) slows the draft and the target
    alike; a price kept in seconds from it would make the draft look dear to every later
    answer, and a guesser priced too dear is never started, so never measured again. The
    target's prompt pass, which every answer takes, is kept in seconds."""

    read_share: dict[str, float] = field(default_factory=dict)
    prefill_cost: float | None = None
    draft_share: dict[str, float] = field(default_factory=dict)
    warm: set[str] = field(default_factory=set)  # guessers that have read once
    target_size: int | None = None  # the target's layers' multiply-adds per token

    def catch_up(self, guesser: str, unread: int, plain_pass: float | None = None,
                 size: int | None = None) -> float:
        """Seconds `guesser` would spend reading `unread` tokens before its first guess, at
        this answer's `plain_pass`; 0 for a read no longer than a pass's, or while nothing
        is measured. Until its reading is measured, the target's prompt pass stands in,
        scaled by the guesser's draft pass against the target's, or before any draft pass
        by its `size` against the target's (multiply-adds per token: reading a prompt is
        arithmetic), at most 1: a draft whose pass is a third of its target's reads in
        about a third of the time, and priced as the target it would not read where it
        pays."""
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
        return unread * self.prefill_cost * min(1.0, 1.0 if scale is None else scale)

    def read(self, guesser: str, tokens: int, seconds: float, plain_pass: float | None) -> None:
        """A catch-up of `tokens` took `seconds` in an answer whose plain pass takes
        `plain_pass`. A guesser's first read is not its cost: it includes its first call's
        warm-up. One slow read counts for at most SPIKE times the price (as a pass does)."""
        if guesser not in self.warm:
            self.warm.add(guesser)
        elif tokens >= READ_SAMPLE and plain_pass:
            self.read_share[guesser] = _fold(self.read_share.get(guesser),
                                             seconds / tokens / plain_pass)

    def drafted(self, guesser: str, seconds: float, plain_pass: float | None) -> None:
        """This answer's estimate of a draft pass of `guesser` is `seconds`."""
        if plain_pass:
            self.draft_share[guesser] = seconds / plain_pass

    def prefilled(self, tokens: int, seconds: float) -> None:
        if tokens >= READ_SAMPLE:
            self.prefill_cost = moving_average(self.prefill_cost, seconds / tokens)


class Planner:
    """The policy beside the loop: before each step it plans who drafts and how much
    (`plan`), after it learns from what verification kept and what the step cost
    (`observe`). One K policy per guesser, made on first use; the target's pass costs are
    the target's, whoever drafted, so the policies share them. Catch-up costs are kept in
    a `Book` that outlives the answer (the generator's)."""

    def __init__(self, k_max: int, adaptive: bool = True, book: Book | None = None) -> None:
        self.verify_cost: dict[int, float] = {}
        self.policies: dict[str, Policy] = {}
        self.k_max, self.adaptive = k_max, adaptive
        self.book = Book() if book is None else book
        self.steps: deque[tuple[int, float]] = deque(maxlen=RECENT_STEPS)  # (tokens, seconds)
        self.confidence: float | None = None  # the target's recent top probability
        self.explored = 0.0  # seconds exploration has cost beyond plain steps, this answer
        self.tried: set[str] = set()  # guessers whose trial was taken against the rules
        self.branch_record = (0, 0.0)  # token trees: branches kept, their summed scores
        self.branch_offer = 0.0  # the summed scores of the last tree's branches

    def _policy(self, guesser: str, drafter: Drafter) -> Policy:
        if guesser not in self.policies:
            self.policies[guesser] = (
                AdaptiveK(self.k_max, verify_cost=self.verify_cost,
                          self_stopping=drafter.ends_own_drafts)
                if self.adaptive else FixedK(self.k_max))
        return self.policies[guesser]

    def _priors(self, guesser: str, drafter: Drafter, policy: Policy) -> None:
        """What an untried guesser is taken to do, from what this answer has measured: its
        pass at its kept share of this answer's plain pass, and, for a draft model, its
        acceptance at the target's recent confidence."""
        if not isinstance(policy, AdaptiveK):
            return
        share, plain = self.book.draft_share.get(guesser), self.verify_cost.get(0)
        if share is not None and plain is not None:
            policy.prior_draft_cost = share * plain
        if drafter.ends_own_drafts and self.confidence is not None:
            policy.prior_alpha = self.confidence

    def prefilled(self, tokens: int, seconds: float) -> None:
        """The target's pass over `tokens` prompt tokens took `seconds`."""
        self.book.prefilled(tokens, seconds)

    def sure(self, probability: float) -> None:
        """The target's pass gave its likeliest token `probability` at the step's first
        position: a sample of how predictable this text is to the target."""
        self.confidence = moving_average(self.confidence, probability)

    def catch_up(self, guesser: str, drafter: Drafter, tokens: Tensor) -> float:
        """Seconds `drafter` would read before guessing for `guesser` (its `unread` tokens;
        none for a drafter that reads nothing of its own)."""
        return self.book.catch_up(guesser, drafter.unread(tokens), self.verify_cost.get(0),
                                  drafter.size)

    def plan(self, drafter: Drafter, tokens: Tensor, limit: int, made: int = 0) -> Plan:
        """The next step's plan, drafting at most `limit` tokens, `made` tokens into the
        answer."""
        offered = drafter.guessers(tokens)
        for guesser, who in offered.items():
            self._priors(guesser, who, self._policy(guesser, who))
        explore = False
        if self.adaptive:
            catch_up = {g: self.catch_up(g, who, tokens) for g, who in offered.items()}
            ahead = horizon(made, limit + 1)
            budget = self._budget(made + limit + 1)

            def exploring(guesser: str, k: int) -> int | None:
                policy = self.policies[guesser]
                if guesser in self.tried and policy.trial(limit):
                    afford = self._afford(guesser, k, catch_up[guesser], budget)
                    if afford:
                        return afford
                    # Out of budget: the trial ends here, and the ordinary rules judge the
                    # guesser on what it has measured (a trial left hanging would keep it
                    # out for the rest of the answer, where those rules would start it).
                    policy.end_trial()
                    return None
                if not (policy.probing or policy.judging):
                    return None
                return self._afford(guesser, k, catch_up[guesser], budget)

            guesser, k = choose_guesser(self.policies, tuple(offered), limit, catch_up,
                                        lambda rate: saving(self.steps, rate, ahead), exploring)
            explore = guesser is not None and exploring(guesser, k) is not None
            if guesser is None:
                guesser, k = self._trial(offered, limit, catch_up, budget)
                explore = guesser is not None
        else:
            guesser, k = choose_guesser(self.policies, tuple(offered), limit)
        if guesser is None:
            return PLAIN
        return Plan(guesser, offered[guesser], k, self.policies[guesser].stop_below(k), explore)

    def _budget(self, asked: int) -> float:
        """Seconds exploration may still cost this answer: EXPLORE_SHARE of what plain
        decoding of the `asked` tokens would take, less what it has cost."""
        plain = self.verify_cost.get(0)
        return EXPLORE_SHARE * plain * asked - self.explored if plain else 0.0

    def _afford(self, guesser: str, k: int, catch_up: float, budget: float) -> int:
        """The largest K up to k whose step fits in `budget` at its worst: its reading, k
        draft passes (an unmeasured one as dear as the target's: a draft is no dearer than
        its target) and the wider verify pass, nothing kept."""
        policy = self.policies[guesser]
        if not isinstance(policy, AdaptiveK) or 0 not in self.verify_cost:
            return 0
        plain = self.verify_cost[0]
        draft = policy.draft_cost if policy.draft_cost is not None else (
            policy.prior_draft_cost or plain)
        for width in range(k, 0, -1):
            verify = verify_bound(self.verify_cost, width)
            if catch_up + width * draft + max(0.0, verify - plain) <= budget:
                return width
        return 0

    def _trial(self, offered: Mapping[str, Drafter], limit: int, catch_up: Mapping[str, float],
               budget: float) -> tuple[str | None, int]:
        """In place of a plain step, the first untried guesser whose trial fits the budget:
        a guesser its prior (or its reading) keeps from drafting is measured all the same,
        since a prior can be wrong; afterwards its measurements decide."""
        for guesser in offered:
            policy = self.policies[guesser]
            if guesser in self.tried or not isinstance(policy, AdaptiveK):
                continue
            k = self._afford(guesser, policy.trial(limit), catch_up[guesser], budget)
            if k:
                self.tried.add(guesser)
                return guesser, k
        return None, 0

    def branches(self, scores: Tensor, tokens: Tensor, k: int) -> list[tuple[int, int]]:
        """The branches a step's chain of k drafts gets (tree.choose_branches): each is worth
        its score in tokens, scaled by how the draft's odds have held for branches so far,
        and costs one more row of the verify pass, at the measured slope of the pass's cost
        per row; a token is worth what one takes at the recent steps' rate. Until two widths
        are measured a row looks free, which gets a wide pass measured."""
        if not self.adaptive or not self.steps:
            return []
        made = sum(n for n, _ in self.steps)
        seconds_per_token = sum(s for _, s in self.steps) / made
        floor = marginal_verify_cost(self.verify_cost) / seconds_per_token / self.branch_odds
        chosen = choose_branches(scores, tokens, max(floor, MIN_BRANCH), MAX_TREE_ROWS - 1 - k)
        self.branch_offer = sum(score for _, _, score in chosen)
        return [(index, token) for index, token, _ in chosen]

    @property
    def branch_odds(self) -> float:
        """Branches kept per unit of their scores (the draft's own odds say 1)."""
        hits, offered = self.branch_record
        return (hits + PRIOR_WEIGHT) / (offered + PRIOR_WEIGHT)

    def observe(self, step: Step) -> None:
        """After a step (core/step.py): its verify pass's cost, its acceptance, its draft
        passes' cost. A drafter that read context first says so (`catch_up`: tokens read,
        seconds): the read is measured apart, and its pass is not a draft pass."""
        plan, k, n_accepted = step.plan, step.drafted, step.kept
        draft_seconds, verify_seconds = step.draft_seconds, step.verify_seconds
        if plan.explore and 0 in self.verify_cost:  # beyond the plain steps its tokens would take
            spent = draft_seconds + verify_seconds - (n_accepted + 1) * self.verify_cost[0]
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
        self.steps.append((n_accepted + 1, draft_seconds + verify_seconds))
        if not k:
            return
        policy = self.policies[plan.guesser]
        # The draft is judged on its chain: a branch's token is the tree's, paid by its rows.
        policy.update(k, step.chain_kept, draft_seconds, passes)
        if policy.draft_cost is not None:
            self.book.drafted(plan.guesser, policy.draft_cost, self.verify_cost.get(0))
