"""The planner: its cost model, and what it chooses in made-up worlds of measured costs."""

import random

import pytest
import torch

from specgen.choices import CATCH_UP_TOKENS
from specgen.core.adaptive import (
    EXPLORE_SHARE, FIRST_REACH, FIRST_STOP, PRIOR_ALPHA, TRIAL_STEPS, Book, Planner, expected_tokens,
    horizon, marginal_verify_cost, record_pass, saving, verify_curve,
)
from specgen.core.base import Drafter
from specgen.core.step import PLAIN, Plan, Step


def observe(planner: Planner, plan: Plan, k: int, n: int, draft_seconds: float,
            verify_seconds: float) -> None:
    """The planner shown a step of `plan` that drafted k tokens and kept n (a chain)."""
    planner.observe(Step(plan, k, n, draft_seconds, verify_seconds))


class Guesser(Drafter):
    """A drafter as the planner sees it: who it offers, and whether it ends its own drafts
    (every other ability the Drafter's default: nothing to read first)."""

    def __init__(self, ends_own_drafts: bool = False, offers: tuple[str, ...] = ("lookup-3",)
                 ) -> None:
        self.ends_own_drafts, self.offers = ends_own_drafts, offers

    def guessers(self, tokens):
        return {name: self for name in self.offers}

    def propose(self, tokens, k, params, generator, stop_below=0.0):
        return torch.zeros(k, dtype=torch.long), None


def test_a_drafter_must_say_who_guesses_and_how_it_proposes():
    """`guessers` and `propose` are every kind's own: a class without them is not a drafter."""
    with pytest.raises(TypeError, match="propose"):
        type("Half", (Drafter,), {"guessers": lambda self, tokens: {}})()
    with pytest.raises(TypeError, match="guessers"):
        type("Half", (Drafter,), {"propose": Guesser.propose})()
    assert Guesser().propose(None, 3, None, None)[0].shape == (3,)


class Both(Guesser):
    """A hybrid: each of `guessers` (name: Guesser) offered where `offered(name)` says."""

    def __init__(self, **guessers: Guesser) -> None:
        super().__init__(False, ())
        self.each, self.offered = guessers, lambda name: True

    def guessers(self, tokens):
        return {name: g for name, g in self.each.items() if self.offered(name)}


def drive(planner: Planner, drafter: Drafter, steps: int, kept=lambda plan: 0, draft=0.01,
          verify=lambda k: 0.2 if k else 0.19, limit: int = 10**6) -> list[Plan]:
    """`steps` steps as the planner plans them: a step of k drafts keeps `kept(plan)` (at
    most k), its drafts cost `draft` s each (or `draft(plan)`), its pass `verify(k)`."""
    plans = []
    for _ in range(steps):
        plan = planner.plan(drafter, None, limit, len(plans) + 1)
        plans.append(plan)
        each = draft(plan) if callable(draft) else draft
        observe(planner, plan, plan.k, min(plan.k, kept(plan)), each * plan.k, verify(plan.k))
    return plans


def ks(plans: list[Plan]) -> list[int]:
    return [plan.k for plan in plans]


def test_verify_cost_of_unmeasured_widths_from_the_measured_ones():
    costs = {0: 1.0, 4: 3.0, 8: 3.4}
    assert verify_curve(costs, 2) == pytest.approx(2.0)  # between neighbours: linear
    assert verify_curve(costs, 6) == pytest.approx(3.2)
    assert verify_curve(costs, 12) == pytest.approx(3.4)  # beyond the widest: flat
    assert verify_curve({4: 0.2}, 0) == pytest.approx(0.2)


def test_marginal_verify_cost_is_the_slope_over_the_measured_speculative_passes():
    assert marginal_verify_cost({0: 0.5, 1: 1.0, 3: 1.2, 9: 1.8}) == pytest.approx(0.1)
    assert marginal_verify_cost({0: 0.5, 2: 1.0}) == 0.0  # one width: no slope yet
    assert marginal_verify_cost({1: 1.0, 4: 0.7}) == 0.0  # noise, never a negative cost


def test_one_slow_pass_moves_its_estimate_by_a_fifth_at_most():
    costs = {0: 0.1}
    record_pass(costs, 0, 5.0)  # the machine busy for a moment: counted as twice the estimate
    assert costs[0] == pytest.approx(0.12)
    for _ in range(20):
        record_pass(costs, 0, 0.5)  # a lasting change is still followed
    assert costs[0] == pytest.approx(0.5, rel=0.02)


def test_a_narrower_pass_never_costs_more_than_a_wider_one():
    costs = {0: 1.0, 2: 1.4}
    record_pass(costs, 4, 0.3)
    assert costs == {0: 0.3, 2: 0.3, 4: 0.3}


def test_a_plain_step_is_measured_first_then_drafts_and_the_first_draft_is_warm_up():
    planner, lookup = Planner(4), Guesser()
    assert planner.plan(lookup, None, 100) == PLAIN  # the cost speculation has to beat
    observe(planner, PLAIN, 0, 0, 0.0, 0.7)
    assert planner.verify_cost[0] == pytest.approx(0.7)
    plan = planner.plan(lookup, None, 100)
    assert plan.guesser == "lookup-3" and plan.k == FIRST_REACH == 2 and not plan.explore
    assert planner.plan(lookup, None, 1).k == 1  # never more than are still wanted
    assert Planner(0).plan(lookup, None, 100) == PLAIN
    observe(planner, plan, 2, 2, 0.2, 0.8)
    assert planner.estimates["lookup-3"].draft_cost is None  # the first one warmed up
    observe(planner, plan, 2, 2, 0.2, 0.8)
    assert planner.estimates["lookup-3"].draft_cost == pytest.approx(0.1)


def test_drafts_widen_in_doublings_of_the_widest_pass_measured():
    """Beyond the widest pass measured the verify cost is a flat guess: a guesser that does
    not end its own drafts goes at most twice as wide, so one wrong guess costs little and
    the widths measured bracket the curve closely (a 16-token first draft on a CPU, where a
    pass of 17 rows costs four of one, once cost more than speculation gained)."""
    plans = drive(Planner(16), Guesser(), 8, kept=lambda plan: plan.k, draft=0.0,
                  verify=lambda k: 0.17 + 0.001 * k)
    assert ks(plans)[:6] == [0, 2, 4, 8, 16, 16]
    self_ended = drive(Planner(16), Guesser(True, ("model",)), 2, kept=lambda plan: plan.k)
    assert self_ended[1].k == 16  # its stop decides its width


def test_a_lookup_guess_goes_wider_than_measured_only_where_its_acceptance_pays_for_it():
    """Beyond the widest pass measured, prompt lookup's width is priced as the curve rose to
    there: one rejected draft (acceptance near its prior's half) keeps the next at 2 on a CPU
    whose passes grow with their rows, where a flat guess took 4 and paid a wide pass for
    nothing; drafts kept whole still widen (the doubling test above)."""
    planner = Planner(16)
    verify = {0: 0.052, 2: 0.061}
    observe(planner, PLAIN, 0, 0, 0.0, verify[0])
    plan = planner.plan(Guesser(), None, 100)
    assert plan.k == 2
    observe(planner, plan, 2, 0, 0.0, verify[2])  # rejected at its first token
    assert 0.4 < planner.estimates["lookup-3"].alpha < 0.5
    assert planner.plan(Guesser(), None, 100).k == 2


def test_speculation_switches_off_when_the_draft_is_too_dear_for_its_acceptance():
    plans = drive(Planner(6), Guesser(), 40, kept=lambda plan: 0, draft=0.08,
                  verify=lambda k: 0.18 if k else 0.17)
    assert ks(plans[-16:]).count(0) >= 15  # plain, but for a probe


def test_a_plain_step_measured_slow_once_does_not_keep_a_useless_draft_on():
    """The plain step's cost is measured only by plain steps: were a slow first one to stay
    in its estimate, a draft that never guesses right would look faster for good."""
    planner, model = Planner(6), Guesser(True, ("model",))
    observe(planner, planner.plan(model, None, 100), 0, 0, 0.0, 1.0)  # slow: warming up
    plans = drive(planner, model, 30, kept=lambda plan: 0, verify=lambda k: 0.2 if k else 0.19)
    assert plans[0].k == 6 and all(ks(plans[:TRIAL_STEPS]))  # measured: its trial
    assert ks(plans[-16:]).count(0) >= 14  # then plain, but for a probe


def test_high_acceptance_and_a_flat_verify_cost_choose_long_drafts():
    planner = Planner(6)
    drive(planner, Guesser(), 30, kept=lambda plan: plan.k, draft=0.02,
          verify=lambda k: 0.17 + 0.001 * k)
    assert planner.plan(Guesser(), None, 100).k == 6
    assert planner.plan(Guesser(), None, 2).k == 2  # never more than are still wanted


def test_dear_verification_shortens_drafts():
    """fp32 on a CPU: a pass over k+1 tokens costs about k+1 steps, so long drafts lose."""
    chosen = {}
    for name, per_token in (("cheap", 0.002), ("dear", 0.17)):
        rng, planner = random.Random(0), Planner(6)
        drive(planner, Guesser(), 60, draft=0.01, verify=lambda k: 0.17 + per_token * k,
              kept=lambda plan: sum(rng.random() < 0.8 for _ in range(plan.k)))
        chosen[name] = planner.plan(Guesser(), None, 100).k
    assert chosen["dear"] < chosen["cheap"] == 6, chosen


def switched_off(ends_own_drafts: bool = False, k_max: int = 6) -> tuple[Planner, Guesser]:
    """A planner that has seen a guesser's drafts fail until it went plain."""
    planner, guesser = Planner(k_max), Guesser(ends_own_drafts, ("model",))
    plans = drive(planner, guesser, 40, kept=lambda plan: 0, draft=0.08,
                  verify=lambda k: 0.18 if k else 0.17)
    assert plans[-1] == PLAIN
    return planner, guesser


def probes(plans: list[Plan]) -> list[int]:
    return [i for i, plan in enumerate(plans) if plan.k]


def test_failed_probes_wait_longer_and_probe_with_one_draft():
    planner, guesser = switched_off()
    wait = planner.estimates["model"].wait
    plans = drive(planner, guesser, 600, kept=lambda plan: 0)
    assert {plan.k for plan in plans} == {0, 1} and all(p.explore for p in plans if p.k)
    at = probes(plans)
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert at[0] < wait and gaps[:4] == [min(wait << i, 128) for i in range(1, 5)]  # up to 128


def test_rejections_while_speculating_do_not_delay_the_first_probe():
    planner, guesser = Planner(6), Guesser(False, ("model",))
    plans = drive(planner, guesser, 200, kept=lambda plan: 0, draft=0.08,
                  verify=lambda k: 0.18 if k else 0.17)
    drafted = probes(plans)
    gaps = [b - a for a, b in zip(drafted, drafted[1:])]
    off = next(i for i, gap in enumerate(gaps) if gap > 1)  # its last draft before going plain
    assert gaps[off] == 16  # 15 plain steps, then the first probe: every rejection before it
    assert sum(not plans[i].explore for i in drafted[:off + 1]) > 1  # was while speculating


def test_a_probe_that_succeeds_resets_the_wait():
    planner, guesser = switched_off()
    drive(planner, guesser, 200, kept=lambda plan: 0)  # failed probes: the wait has grown
    assert planner.estimates["model"].wait > 16
    plans = drive(planner, guesser, 300, kept=lambda plan: 1)  # the next probe is kept
    assert plans[probes(plans)[0]].explore and planner.estimates["model"].wait == 16


def test_the_next_guesser_drafts_when_the_first_declines():
    both = Both(**{"lookup-1": Guesser(), "model": Guesser()})
    planner = Planner(6)
    drive(planner, both, 40, kept=lambda plan: plan.k if plan.guesser == "model" else 0,
          draft=0.01, verify=lambda k: 0.18 if k else 0.17)
    plan = planner.plan(both, None, 100)
    assert plan.guesser == "model" and plan.k > 0
    fixed = Planner(3, adaptive=False)  # adaptive off: the drafter's order decides
    assert (fixed.plan(both, None, 100).guesser, fixed.plan(both, None, 100).k) == ("lookup-1", 3)
    assert planner.plan(Both(), None, 100) == PLAIN  # nobody to guess: a plain step


def test_the_guesser_with_the_better_expected_rate_drafts():
    """Both would draft; the one expected to yield more tokens per second gets the step."""
    rng = random.Random(0)
    both = Both(**{"lookup-1": Guesser(), "model": Guesser()})
    planner = Planner(6)
    both.offered = lambda name: name == "lookup-1"  # lookup at a short match: free, often wrong
    drive(planner, both, 30, kept=lambda plan: int(rng.random() < 0.3), draft=0.0,
          verify=lambda k: 0.18 if k else 0.17)
    assert planner.plan(both, None, 100).k > 0  # better than a plain step
    both.offered = lambda name: name == "model"  # the model: dearer, always right
    drive(planner, both, 30, kept=lambda plan: plan.k, draft=0.01)
    both.offered = lambda name: True
    assert planner.plan(both, None, 100).guesser == "model"


def test_an_untried_guesser_drafts_where_it_could_beat_the_tried_ones_or_is_tried_in_a_plain_step():
    """Untried, a guesser counts as free at the prior acceptance: a hybrid's model is not
    woken while lookup guesses well, but drafts where lookup guesses badly."""
    for lookup_keeps, expected in ((True, "lookup-3"), (False, "model")):
        both = Both(**{"lookup-3": Guesser(), "model": Guesser()})
        both.offered = lambda name: name == "lookup-3"
        planner = Planner(6)
        drive(planner, both, 30, kept=lambda plan: plan.k if lookup_keeps else 0, draft=0.0,
              verify=lambda k: 0.18 if k else 0.17)
        both.offered = lambda name: True
        plan = planner.plan(both, None, 100)
        assert plan.guesser == expected and not plan.explore
    fresh = Both(**{"lookup-3": Guesser(), "model": Guesser()})
    planner = Planner(6)
    assert planner.plan(fresh, None, 100) == PLAIN  # a plain step first
    observe(planner, PLAIN, 0, 0, 0.0, 0.17)
    assert planner.plan(fresh, None, 100).guesser == "lookup-3"  # the first of equals


def test_a_switched_off_guessers_probe_takes_its_step():
    """A hybrid's model switched off early is measured again only by its probes: at a probe
    it drafts even where lookup's guesses outscore it, and between probes lookup drafts."""
    rng = random.Random(0)
    both = Both(**{"lookup-1": Guesser(), "model": Guesser(True, ("model",))})
    planner = Planner(6)

    def kept(plan):
        return int(rng.random() < 0.5) if plan.guesser == "lookup-1" else 0

    draft = lambda plan: 0.05 if plan.guesser == "model" else 0.0  # noqa: E731
    drive(planner, both, 60, kept=kept, draft=draft, verify=lambda k: 0.18 if k else 0.17)
    plans = drive(planner, both, 80, kept=kept, draft=draft, verify=lambda k: 0.18 if k else 0.17)
    picks = [plan.guesser for plan in plans]
    assert "model" in picks and picks.count("lookup-1") > len(picks) // 2
    assert all(plan.explore for plan in plans if plan.guesser == "model")  # each a probe


def test_only_a_failed_probe_makes_the_next_wait_longer():
    """Rejections of drafts the rule chose leave the wait alone: they say nothing of how soon
    after switching off the draft may be worth another try."""
    planner, guesser = Planner(6), Guesser(False, ("model",))
    drive(planner, guesser, 10, kept=lambda plan: 0)  # the rule's drafts, failing
    assert planner.estimates["model"].wait == 16


def measured(ends_own_drafts: bool, k_max: int = 16) -> tuple[Planner, Guesser]:
    """A planner that has measured everything: drafts of 4 mostly kept."""
    planner, guesser = Planner(k_max), Guesser(ends_own_drafts, ("model",))
    plan = Plan("model", guesser, 4, 0.1 if ends_own_drafts else 0.0)
    for _ in range(30):
        observe(planner, plan, 4, 3, 0.2, 0.8)
    observe(planner, Plan("model", guesser, 1, plan.stop_below), 1, 1, 0.05, 0.7)
    observe(planner, PLAIN, 0, 0, 0.0, 0.6)
    return planner, guesser


def test_a_self_stopping_guesser_is_offered_k_max_and_a_stop_threshold():
    (planner, model), (plain, lookup) = measured(True), measured(False)
    plan = plain.plan(lookup, None, 100)
    assert 0 < plan.k < 16 and plan.stop_below == 0.0  # one K for every step
    plan = planner.plan(model, None, 100)
    assert plan.k == 16 and planner.plan(model, None, 5).k == 5
    # One more token costs a draft pass (0.05 s) plus the verify slope ((0.8 - 0.7) / 3 s);
    # it must be worth that many seconds at the expected rate.
    slope = (planner.verify_cost[4] - planner.verify_cost[1]) / 3
    rate = planner.option("model", model, 16).rate
    assert plan.stop_below == pytest.approx(rate * (0.05 + slope))
    assert 0 < plan.stop_below < 1


def test_a_self_stopping_guesser_stops_at_a_fixed_threshold_until_costs_are_measured():
    planner, model = Planner(16), Guesser(True, ("model",))
    assert planner.plan(model, None, 100) == PLAIN
    observe(planner, PLAIN, 0, 0, 0.0, 0.17)
    plan = planner.plan(model, None, 100)
    assert plan.k == 16 and plan.stop_below == FIRST_STOP
    assert Planner(4, adaptive=False).plan(model, None, 100).stop_below == 0.0  # K is K


def test_a_useless_self_stopping_draft_is_switched_off_and_probed_by_a_self_ended_draft():
    planner, model = switched_off(ends_own_drafts=True)
    plans = drive(planner, model, 40, kept=lambda plan: 0)
    drafted = [plan for plan in plans if plan.k]
    assert drafted and all(p.k == 6 and p.stop_below > 0 and p.explore for p in drafted)
    assert len(drafted) <= 40 // 4


def test_a_self_ended_draft_is_judged_by_its_measured_yield_against_a_plain_step():
    planner, model = Planner(16), Guesser(True, ("model",))
    observe(planner, PLAIN, 0, 0, 0.0, 0.5)  # a plain step: 2 tokens/s
    plans = drive(planner, model, 20, kept=lambda plan: plan.k - 1, draft=0.1,
                  verify=lambda k: 0.9 if k else 0.5)  # 8 tokens for 1.7 s: drafting pays
    assert all(plan.k for plan in plans)
    plans = drive(planner, model, 20, kept=lambda plan: 0, draft=0.1,
                  verify=lambda k: 0.9 if k else 0.5)  # then every draft fails
    assert plans[-1] == PLAIN


def test_a_kept_self_ended_probe_alone_decides_whether_to_speculate_again():
    planner, model = Planner(16), Guesser(True, ("model",))
    observe(planner, PLAIN, 0, 0, 0.0, 0.5)
    verify = lambda k: 0.85 if k else 0.5  # noqa: E731
    drive(planner, model, 200, kept=lambda plan: 0, draft=0.1, verify=verify)  # a long bad stretch
    plans = drive(planner, model, 300, kept=lambda plan: 1, draft=0.1, verify=verify)
    first = probes(plans)[0]  # kept, but 2 tokens in 1.45 s: worse than plain
    assert plans[first].explore and PLAIN in plans[first + 1:first + TRIAL_STEPS + 2]
    plans = drive(planner, model, 300, kept=lambda plan: plan.k, draft=0.1, verify=verify)
    first = probes(plans)[0]  # the text has turned easy: it drafts on
    assert all(plan.k for plan in plans[first:])


def test_the_planner_makes_one_estimate_per_guesser_on_first_use():
    planner = Planner(4)
    model, lookup = Guesser(True, ("model",)), Guesser(False, ("lookup-2",))
    observe(planner, planner.plan(model, None, 100), 0, 0, 0.0, 0.2)  # plain: none made yet
    assert planner.estimates == {}
    planner.plan(model, None, 100)
    planner.plan(lookup, None, 100)
    estimates = planner.estimates
    assert estimates["model"].ends_own and not estimates["lookup-2"].ends_own
    assert estimates["model"].wait == 4 and estimates["lookup-2"].wait == 16
    first = estimates["model"]
    planner.plan(model, None, 100)
    assert estimates["model"] is first and len(estimates) == 2


def test_the_planner_learns_the_passes_and_the_drafts_it_planned():
    planner = Planner(4)
    drafter = Guesser(True, ("model",))
    observe(planner, planner.plan(drafter, None, 100), 0, 0, 0.0, 0.2)
    assert planner.verify_cost == {0: 0.2}
    plan = planner.plan(drafter, None, 100)
    assert plan.drafter is drafter and plan.guesser == "model" and plan.k == 4
    assert plan.stop_below == FIRST_STOP  # a self-ended draft's, until its costs are known
    observe(planner, plan, 3, 3, 0.3, 0.25)  # the drafter found 3 of 4
    assert planner.verify_cost == {0: 0.2, 3: 0.25}
    assert planner.estimates["model"].alpha > PRIOR_ALPHA  # three kept
    assert planner.plan(drafter, None, 2).k <= 2  # never more than are still wanted


def test_a_fixed_k_planner_always_drafts_k():
    planner = Planner(3, adaptive=False)
    drafter = Guesser(False, ("lookup-1",))
    assert planner.plan(drafter, None, 100).k == 3 and planner.plan(drafter, None, 1).k == 1
    drive(planner, drafter, 20, kept=lambda plan: 0, draft=1.0)  # however badly it does
    assert planner.plan(drafter, None, 100).k == 3
    assert planner.plan(Guesser(False, ()), None, 100) == PLAIN  # nobody offers: plain


def test_a_self_ended_draft_gets_a_few_steps_before_its_yield_is_judged():
    planner, model = Planner(16), Guesser(True, ("model",))
    observe(planner, PLAIN, 0, 0, 0.0, 0.5)
    plans = drive(planner, model, 6, kept=lambda plan: 0, draft=0.1,
                  verify=lambda k: 0.9 if k else 0.5)  # every draft fails
    assert ks(plans)[0] == 16 and all(ks(plans[:TRIAL_STEPS])) and ks(plans[-2:]) == [0, 0]


def test_expected_tokens():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


# --- catch-up: what a guesser reads before it guesses -----------------------------------------

def test_saving_counts_only_the_steps_slower_than_the_guesser():
    steps = [(1, 1.0), (1, 1.0), (5, 1.0)]  # two plain steps, one step of 5 tokens
    # At 2 tokens/s a token takes 0.5 s: each plain step would have saved 0.5 s, the fast
    # step nothing; 1 s saved over 7 tokens, extrapolated to 14.
    assert saving(steps, 2.0, 14) == pytest.approx(2.0)
    assert saving(steps, 0.5, 14) == 0.0  # slower than every step
    assert saving([], 2.0, 14) == 0.0 and saving(steps, 2.0, 0) == 0.0


def test_the_horizon_is_what_the_answer_has_made_so_far_within_what_is_left():
    assert horizon(made=10, left=100) == 10  # as long again as it has gone
    assert horizon(made=100, left=10) == 10  # never past what is still wanted
    assert horizon(made=0, left=10) == 0


class Reader(Guesser):
    """A draft model as the planner sees it: it has `unread` tokens to read first, and
    after a propose says what its reading cost (`catch_up`)."""

    def __init__(self, unread: int) -> None:
        super().__init__(True, ("model",))
        self.to_read, self.catch_up = unread, (0, 0.0)

    def unread(self, tokens):
        return self.to_read


def test_a_guesser_with_reading_to_do_drafts_only_where_that_is_repaid():
    """The same measured draft, with 700 tokens to read first at 2 ms a token (1.4 s): early
    in the answer what it would have saved is less than that, and it waits; later it drafts."""
    book = Book(read_share={"model": 0.002 / 0.2}, draft_share={"model": 0.01 / 0.2})
    planner, keen = Planner(6, book=book), Reader(0)
    drive(planner, keen, 30, kept=lambda plan: plan.k, verify=lambda k: 0.2)
    drive(planner, Guesser(False, ()), 30, verify=lambda k: 0.2)  # then plain steps
    assert planner.plan(keen, None, 100, 1).guesser == "model"  # nothing to read
    keen.to_read = 700
    assert planner.plan(keen, None, 1000, 2) == PLAIN  # 2 tokens in: not repaid yet
    assert planner.plan(keen, None, 1000, 400).guesser == "model"


def test_a_draft_whose_catch_up_cannot_be_repaid_within_what_is_left_is_not_started():
    """A 700-token prompt the draft would read at 2 ms a token (1.4 s), plain steps of 0.2 s,
    a draft yielding about 2.5 tokens per step: it saves about 0.12 s a token, so it starts
    only once the answer has run about 12 tokens, and never with fewer than that left."""
    book = Book(prefill_cost=0.002, read_share={"model": 0.002 / 0.2}, draft_share={"model": 0.01 / 0.2})
    reader = Reader(700)

    def first_draft(left: int) -> int | None:
        planner = Planner(8, book=book)
        made = 1
        while made < left:
            plan = planner.plan(reader, None, left - made - 1, made)
            if plan.drafter is not None:
                return made
            observe(planner, plan, 0, 0, 0.0, 0.2)
            made += 1
        return None

    started = first_draft(200)
    assert started is not None and 8 <= started <= 16
    assert first_draft(2 * started - 2) is None  # with that many left, not repaid
    assert first_draft(12) is None
    assert Planner(8, book=Book()).catch_up("model", reader, None) == 0.0  # nothing measured yet
    assert Planner(8, book=book).catch_up("model", Reader(7), None) == 0.0  # a pass's reading


def test_the_reading_is_measured_apart_from_drafting_and_kept_across_answers():
    book = Book(prefill_cost=0.002)
    planner = Planner(8, book=book)
    reader = Reader(700)
    observe(planner, planner.plan(reader, None, 100, 1), 0, 0, 0.0, 0.2)
    plan = Plan("model", reader, 8)
    reader.catch_up = (700, 2.1)  # its first forward read 700 tokens, warming up
    observe(planner, plan, 4, 4, 2.1 + 3 * 0.02, 0.25)
    assert "model" not in book.read_share  # a first read is not the reading's cost
    reader.catch_up = (700, 0.7)  # a later one read 700 tokens in 0.7 s
    observe(planner, plan, 4, 4, 0.7 + 3 * 0.02, 0.25)  # then 3 draft passes of 0.02 s
    assert book.read_share["model"] == pytest.approx(0.001 / 0.2)  # per second of a plain pass
    reader.catch_up = (0, 0.0)
    observe(planner, plan, 4, 4, 4 * 0.02, 0.25)
    assert planner.estimates["model"].draft_cost == pytest.approx(0.02)  # the reading left out
    assert book.draft_share["model"] == pytest.approx(0.02 / 0.2)
    nxt = Planner(8, book=book)  # the next answer prices the draft before it drafts,
    observe(nxt, nxt.plan(reader, None, 100, 1), 0, 0, 0.0, 0.1)  # on a machine twice as fast
    assert nxt.catch_up("model", Reader(500), None) == pytest.approx(0.25)
    nxt.plan(reader, None, 100, 2)
    assert nxt.estimates["model"].prior_cost == pytest.approx(0.01)


def test_an_unmeasured_reading_is_priced_at_the_targets_scaled_by_the_drafts_pass():
    """Priced as the target's own prompt pass, a draft a third its target's size would be
    priced at three times its reading: where it pays, it would never read."""
    book = Book(prefill_cost=0.003, draft_share={"model": 1 / 3, "big": 1.5})
    assert book.catch_up("model", 100, plain_pass=0.045) == pytest.approx(0.1)
    assert book.catch_up("big", 100, plain_pass=0.045) == pytest.approx(0.3)  # never above
    assert book.catch_up("self", 100, plain_pass=0.045) == pytest.approx(0.3)  # no pass known
    book.read_share["model"] = 0.002 / 0.045
    assert book.catch_up("model", 100, plain_pass=0.045) == pytest.approx(0.2)  # measured wins
    planner = Planner(4, book=Book(prefill_cost=0.003, draft_share={"model": 1 / 3}))
    observe(planner, PLAIN, 0, 0, 0.0, 0.045)
    assert planner.catch_up("model", Reader(100), None) == pytest.approx(0.1)


def test_before_any_draft_pass_a_reading_is_priced_by_the_drafts_size():
    """A draft model's reading, before it has drafted at all, at its layers' multiply-adds
    against the target's (a third here): not as the target's own prompt pass, which would
    keep a small draft from ever starting on a first answer's long prompt."""
    book = Book(prefill_cost=0.003, target_size=300)
    assert book.catch_up("model", 100, plain_pass=0.045, size=100) == pytest.approx(0.1)
    assert book.catch_up("model", 100, plain_pass=0.045, size=900) == pytest.approx(0.3)  # never above
    assert book.catch_up("model", 100, plain_pass=0.045) == pytest.approx(0.3)  # size unknown
    book.draft_share["model"] = 0.5  # a measured draft pass wins over the size
    assert book.catch_up("model", 100, plain_pass=0.045, size=100) == pytest.approx(0.15)
    assert Book(prefill_cost=0.003).catch_up("model", 100, 0.045, size=100) == pytest.approx(0.3)
    planner = Planner(4, book=Book(prefill_cost=0.003, target_size=300))
    reader = Reader(100)
    reader.size = 100
    assert planner.catch_up("model", reader, None) == pytest.approx(0.1)


def test_a_prompt_pass_slow_once_prices_a_reading_at_most_as_one_token_passes():
    """A first run compiled a kernel inside the target's prompt pass: seconds a token. Priced
    from it, a draft would never read where it pays; a prompt token costs at most a plain
    pass of the target."""
    book = Book(prefill_cost=0.5, target_size=300)
    assert book.catch_up("model", 100, plain_pass=0.045, size=100) == pytest.approx(1.5)
    assert book.catch_up("model", 100, plain_pass=None, size=100) == pytest.approx(100 * 0.5 / 3)
    assert Book(prefill_cost=0.003).catch_up("model", 100, 0.045) == pytest.approx(0.3)  # below: as measured


def test_a_generator_knows_its_models_sizes(tiny_pair):
    from specgen.core.engine import SpeculativeGenerator
    from specgen.models.config import layer_params

    target, draft = tiny_pair("qwen2")
    gen = SpeculativeGenerator(target, draft, 4)
    for model, size in ((target, gen.book.target_size), (draft, gen.drafter.model_drafter.size)):
        weights = sum(m.weight.numel() for layer in model.model.layers
                      for m in layer.modules() if isinstance(m, torch.nn.Linear))
        assert size == layer_params(model.config) == weights


def test_a_fixed_k_planner_pays_no_heed_to_reading():
    planner = Planner(3, adaptive=False, book=Book(prefill_cost=1.0))
    assert planner.plan(Reader(700), None, 100, 1).k == 3


# --- a made-up world: lookup, a draft model and the hybrid, on synthetic yields ---------------

class World:
    """Plain steps cost 1 s; a verify pass 1 s + `slope` a drafted token; the draft model
    `draft` s a pass, reads the prompt at `read` s a token, keeps each token with chance
    `alpha_model` and ends its drafts at `model_len`; prompt lookup matches at a step with
    chance `p_match` and keeps each token with chance `alpha_lookup`. `run` gives tokens/s
    of one answer, the target's prompt pass included."""

    def __init__(self, prompt=700, new=64, slope=0.02, draft=0.2, read=0.004, prefill=0.006,
                 alpha_model=0.7, model_len=4, alpha_lookup=0.8, p_match=0.5):
        self.__dict__.update(locals())

    def run(self, method: str, seed: int, book: Book) -> float:
        rng = random.Random(seed)
        model, lookup = Reader(self.prompt + 1), Guesser(False, ("lookup-3",))
        both = Guesser(True, ())
        offers = {"model": lambda: {"model": model},
                  "lookup": lambda: {"lookup-3": lookup} if match else {},
                  "hybrid": lambda: {**({"lookup-3": lookup} if match else {}), "model": model}}
        both.guessers = lambda tokens: offers[method]()
        planner = Planner(8, book=book)
        planner.prefilled(self.prompt, self.prompt * self.prefill)
        seconds, made = self.prompt * self.prefill + 1.0, 1
        while made < self.new:
            match = rng.random() < self.p_match
            plan = planner.plan(both, None, self.new - made - 1, made)
            k, draft_s, alpha, model.catch_up = 0, 0.0, 0.0, (0, 0.0)
            if plan.drafter is model:
                k, alpha = min(plan.k, self.model_len), self.alpha_model
                if model.to_read >= CATCH_UP_TOKENS:
                    model.catch_up = (model.to_read, model.to_read * self.read)
                draft_s = model.catch_up[1] + k * self.draft
            elif plan.drafter is lookup:
                k, alpha = plan.k, self.alpha_lookup
            n = 0
            while n < k and rng.random() < alpha:
                n += 1
            observe(planner, plan, k, n, draft_s, 1.0 + self.slope * k)
            seconds += draft_s + 1.0 + self.slope * k
            made += n + 1
            model.to_read = 1 if plan.drafter is model else model.to_read + n + 1
        return made / seconds

    def rates(self, seeds=range(24)) -> dict[str, float]:
        """Each method's mean tokens/s over `seeds`, after two unmeasured answers that
        fill the book (as a session's first answers do: a guesser's first read is its
        warm-up, not its cost)."""
        out = {}
        for method in ("model", "lookup", "hybrid"):
            book = Book()
            self.run(method, 98, book)
            self.run(method, 99, book)
            out[method] = sum(self.run(method, s, book) for s in seeds) / len(seeds)
        return out


@pytest.mark.parametrize("world", [
    World(),  # summarization: lookup matches half the steps and mostly holds
    World(alpha_lookup=0.95, p_match=0.7, alpha_model=0.6),  # lookup copies long passages
    World(prompt=700, read=0.02, alpha_lookup=0.6),  # a dear reading of the prompt
    World(prompt=600, new=20, alpha_lookup=0.5, p_match=0.4),  # a short answer to a long prompt
    World(prompt=40, alpha_model=0.85, model_len=6, alpha_lookup=0.2, p_match=0.9),  # code
    World(alpha_lookup=0.3, p_match=0.8, alpha_model=0.9, model_len=8, new=128),  # lookup junk
    World(prompt=300, alpha_model=0.75, p_match=0.0),  # nothing to look up
    World(draft=0.05),  # a cheap draft: both help
    World(prompt=100, alpha_model=0.5, p_match=0.2, alpha_lookup=0.5),  # neither helps much
], ids=["summarization", "copying", "dear-reading", "short-answer", "code", "junk-lookup",
        "no-lookup", "cheap-draft", "both-weak"])
def test_the_hybrid_is_never_below_the_better_of_lookup_and_the_draft_model(world):
    """Within what finding out costs: a draft model's reading is paid before its guesses
    on this text are known (the ski-rental rule bounds that), and a guesser that looks as
    good as the one drafting is tried. Without the catch-up in the plan the hybrid fell
    17-22% below lookup in the first three worlds."""
    rates = world.rates()
    assert rates["hybrid"] >= 0.93 * max(rates["model"], rates["lookup"]), rates


def test_a_draft_model_whose_reading_is_not_repaid_leaves_plain_decoding_as_it_was():
    """A short answer to a long prompt, the draft dear to read: plain steps throughout, so
    the draft-model method is plain decoding (within what its probes cost)."""
    world = World(prompt=700, new=24, read=0.02, alpha_model=0.7, p_match=0.0)
    plain = world.new / (world.prompt * world.prefill + world.new)
    assert world.rates()["model"] == pytest.approx(plain, rel=0.01)


def test_a_switched_off_draft_still_probes_when_it_has_fallen_behind():
    """A probe asks whether the draft has become useful again; what it has to read to catch
    up is part of asking, not a start-up to be repaid."""
    book = Book(read_share={"model": 0.001 / 0.17}, prefill_cost=0.001)
    planner = Planner(6, book=book)
    reader = Reader(20)
    observe(planner, planner.plan(reader, None, 1000, 1), 0, 0, 0.0, 0.17)
    plans = drive(planner, reader, 40, kept=lambda plan: 0, draft=0.08,
                  verify=lambda k: 0.18 if k else 0.17)  # useless so far: switched off
    assert plans[-1] == PLAIN
    reader.to_read = 300  # it has fallen behind: 0.3 s to read
    wait = planner.estimates["model"].wait
    plans = drive(planner, reader, wait, verify=lambda k: 0.18 if k else 0.17)
    assert any(plan.k == 6 and plan.explore for plan in plans)  # a self-ended probe


def test_lookup_drafts_first_and_the_draft_joins_once_what_it_would_save_covers_its_reading():
    """A 500-token prompt the draft reads at 2 ms a token (1 s); plain steps of 0.2 s.
    Lookup matches every `every` steps and keeps `kept` of its drafts. Where it matches
    every step and its guesses hold, its steps already make tokens faster than the draft
    would: the draft never starts. Where they fail, lookup drafts first, and the draft
    starts once the seconds it would have saved on the answer so far pay for its reading:
    the first plan where saving(steps, rate, horizon) exceeds 1 s."""
    def run(kept: int, every: int) -> tuple[list[str], list[tuple[list, float, int]]]:
        book = Book(read_share={"model": 0.002 / 0.2}, draft_share={"model": 0.01 / 0.2})
        planner = Planner(6, book=book)
        model, lookup = Reader(500), Guesser(False, ("lookup-3",))
        hybrid = Both(**{"lookup-3": lookup, "model": model})
        chosen, made, seen = [], 1, []  # seen: the recent steps, the draft's rate, made
        while made < 200:
            match = len(chosen) % every == every - 1
            hybrid.offered = lambda name: match or name == "model"
            # 150 tokens asked: exploring would cost more than EXPLORE_SHARE of them, so
            # only the ski-rental rule starts the draft.
            plan = planner.plan(hybrid, None, 150, made)
            if planner.verify_cost:
                seen.append((list(planner.steps), planner.option("model", model, 6).rate, made))
            chosen.append(plan.guesser or "plain")
            if plan.guesser == "model":
                return chosen, seen
            n = min(kept, plan.k)
            observe(planner, plan, plan.k, n, 0.0, 0.2 + 0.01 * plan.k)
            made += n + 1
            model.to_read += n + 1
        return chosen, seen

    chosen, _ = run(kept=6, every=1)  # lookup copies: its steps make 7 tokens for 0.26 s
    assert "model" not in chosen and "lookup-3" in chosen
    chosen, seen = run(kept=0, every=2)  # lookup's guesses fail: no faster than plain steps
    assert chosen[-1] == "model" and "lookup-3" in chosen[:-1] and not chosen.count("model") > 1
    (steps, rate, made), (before, rate_before, made_before) = seen[-1], seen[-2]
    assert saving(steps, rate, made) > (500 + made - 1) * 0.002  # repaid now
    assert saving(before, rate_before, made_before) <= (500 + made_before - 1) * 0.002  # not sooner


def test_an_untried_draft_models_acceptance_is_how_sure_the_target_has_been():
    """A draft model approximates the target, so it agrees with the target's choice about
    as often as the target is sure of it; prompt lookup copies the context, whose repeats
    the target's confidence says nothing about: its prior stays PRIOR_ALPHA."""
    planner = Planner(4)
    model, lookup = Guesser(True, ("model",)), Guesser(False, ("lookup-2",))
    observe(planner, PLAIN, 0, 0, 0.0, 0.2)
    planner.plan(model, None, 100)
    planner.plan(lookup, None, 100)
    assert planner.estimates["model"].alpha == pytest.approx(PRIOR_ALPHA)  # nothing heard yet
    for _ in range(40):
        planner.sure(0.95)
    planner.plan(model, None, 100)
    planner.plan(lookup, None, 100)
    assert planner.estimates["model"].alpha == pytest.approx(0.95, abs=1e-3)
    assert planner.estimates["lookup-2"].alpha == pytest.approx(PRIOR_ALPHA)
    # then what the draft does counts, the prior fading as it goes
    observe(planner, Plan("model", model, 4, FIRST_STOP), 4, 0, 0.0, 0.25)
    assert planner.estimates["model"].alpha < 0.95 * 0.7


def test_a_draft_model_starts_sooner_where_the_target_is_sure():
    """The same answer, plain steps of 0.2 s, a 200-token prompt the draft reads at 2 ms a
    token: where the target is sure of its tokens the draft is expected to keep most of its
    guesses, so what it would save pays for its reading in fewer steps; where the target
    hesitates it is expected to save little, and starts later."""
    def first_draft(sure: float) -> int:
        planner = Planner(6, book=Book(read_share={"model": 0.002 / 0.2}, draft_share={"model": 0.1}))
        reader = Reader(200)
        for made in range(1, 200):
            planner.sure(sure)
            # 60 tokens asked: a trial would cost more than EXPLORE_SHARE of them, so the
            # prior alone decides when the draft starts.
            plan = planner.plan(reader, None, 60, made)
            if plan.guesser == "model":
                return made
            observe(planner, plan, 0, 0, 0.0, 0.2)
            reader.to_read += 1
        return 200

    assert first_draft(0.95) < first_draft(0.7) < first_draft(0.5)


def test_a_busy_spell_of_the_machine_does_not_price_the_draft_out_of_later_answers():
    """Another job takes the cores for one answer: the target's plain pass, the draft's
    passes and its reading all take twice as long. The next answer, on a quiet machine,
    prices the draft as it costs there, not as it cost then; in seconds the busy spell
    would double its price, and a draft priced too dear is never started, so never
    measured again."""
    book = Book()
    reader = Reader(500)

    def answer(plain: float) -> Planner:
        planner = Planner(6, book=book)
        observe(planner, planner.plan(reader, None, 1000, 1), 0, 0, 0.0, plain)
        plan = Plan("model", reader, 4)
        for read in (500, 500):  # the second read is measured (the first is warm-up)
            reader.catch_up = (read, read * 0.01 * plain)
            observe(planner, plan, 4, 4, read * 0.01 * plain + 3 * 0.1 * plain, 1.25 * plain)
        reader.catch_up = (0, 0.0)
        for _ in range(3):
            observe(planner, plan, 4, 4, 4 * 0.1 * plain, 1.25 * plain)
        return planner

    answer(plain=0.4)  # busy
    quiet = Planner(6, book=book)
    observe(quiet, quiet.plan(reader, None, 1000, 1), 0, 0, 0.0, 0.2)
    assert quiet.catch_up("model", Reader(500), None) == pytest.approx(500 * 0.01 * 0.2)
    quiet.plan(reader, None, 1000, 2)
    assert quiet.estimates["model"].prior_cost == pytest.approx(0.1 * 0.2)


def test_a_guesser_priced_dear_by_earlier_answers_is_timed_again():
    """A price kept from earlier answers may be stale (a busy spell): a guesser with nothing
    to read first drafts until this answer has timed its pass, and then its measurements
    decide; priced out on the old price alone, it would never be timed again."""
    book = Book(draft_share={"model": 3.0})
    planner, model = Planner(4, book=book), Guesser(True, ("model",))
    plans = drive(planner, model, 10, kept=lambda plan: plan.k, draft=0.02, verify=lambda k: 0.2)
    assert plans[0] == PLAIN and all(plan.k and not plan.explore for plan in plans[1:])
    assert book.draft_share["model"] == pytest.approx(0.1)


def test_one_slow_reading_moves_its_price_by_a_fifth_at_most():
    book = Book()
    for seconds in (1.0, 0.5):  # warm-up, then 100 tokens in 0.5 s at a 0.1 s plain pass
        book.read("model", 100, seconds, 0.1)
    assert book.read_share["model"] == pytest.approx(0.05)
    book.read("model", 100, 5.0, 0.1)  # ten times as slow, once
    assert book.read_share["model"] == pytest.approx(0.05 * 1.2)
    book.read("model", 100, 0.5, None)  # no plain pass measured: nothing to share it by
    assert book.read_share["model"] == pytest.approx(0.05 * 1.2)


# --- a low prior: the planner tries the draft, then keeps it only on what it measured ------

class Pair:
    """A draft model beside its target, on made-up costs: a plain pass costs 1 s, a verify
    pass 1 s + `slope` a drafted token, a draft pass `draft` s; the draft reads the prompt
    at `read` s a token (the target at `prefill`). The draft guesses the target's token at
    each position of the answer with chance `agreement` (drawn once per position, so that
    every method sees the same text), while the draft gives each of its tokens only `claimed` probability
    and the target is only `sure` of its own (random weights, or prose: the argmax agrees
    far more often than either model's probabilities say). `run` gives one answer's tokens
    per second, the target's prompt pass included, and the planner."""

    def __init__(self, agreement, draft, slope=0.0, claimed=0.05, sure=0.05, prompt=100,
                 read=0.001, prefill=0.01, new=128):
        self.__dict__.update(locals())

    def run(self, planner: Planner, seed: int) -> tuple[float, list[int]]:
        rng = random.Random(seed)
        agrees = [rng.random() < self.agreement for _ in range(self.new + 16)]
        model = Reader(self.prompt + 1)
        planner.prefilled(self.prompt, self.prompt * self.prefill)
        seconds, made, ks = self.prompt * self.prefill + 1.0, 1, []
        while made < self.new:
            planner.sure(self.sure)
            plan = planner.plan(model, None, self.new - made - 1, made)
            k, draft_s, model.catch_up = 0, 0.0, (0, 0.0)
            if plan.drafter is model:
                if model.to_read >= CATCH_UP_TOKENS:
                    model.catch_up = (model.to_read, model.to_read * self.read)
                likely = 1.0  # the draft ends itself as ModelDrafter does
                while k < plan.k:
                    k += 1
                    likely *= self.claimed
                    if likely < plan.stop_below:
                        break
                draft_s = model.catch_up[1] + k * self.draft
            n = 0
            while n < k and agrees[made + n]:
                n += 1
            verify_s = 1.0 + self.slope * k
            observe(planner, plan, k, n, draft_s, verify_s)
            seconds += draft_s + verify_s
            made += n + 1
            ks.append(k)
            model.to_read = 1 if plan.drafter is model else model.to_read + n + 1
        return made / seconds, ks

    def rate(self, k_max: int, adaptive: bool, seeds=range(12)) -> tuple[float, list[Planner], list[int]]:
        """Mean tokens/s over `seeds` (after one answer that fills the book), the planners
        and the K of each step of the last answer."""
        book, planners, rates = Book(), [], []
        self.run(Planner(k_max, adaptive, book), 99)
        for seed in seeds:
            planners.append(Planner(k_max, adaptive, book))
            rate, ks = self.run(planners[-1], seed)
            rates.append(rate)
        return sum(rates) / len(rates), planners, ks

    def plain(self) -> float:
        return self.new / (self.prompt * self.prefill + self.new)


def test_a_draft_the_target_agrees_with_is_tried_despite_a_low_prior_and_run_at_the_best_k():
    """The target is sure of 5% of its tokens, the draft claims 5% of its own, yet the
    target keeps 80% of the draft's guesses and a draft pass costs a tenth of a plain one.
    On its prior the draft would never start; and ended by its own probabilities every
    draft would be one token long. Tried, it is kept, at about the best fixed K."""
    pair = Pair(agreement=0.8, draft=0.1)
    fixed = {k: pair.rate(k, adaptive=False)[0] for k in range(1, 9)}
    best = max(fixed, key=fixed.get)
    rate, _, ks = pair.rate(8, adaptive=True)
    assert rate >= 0.95 * fixed[best], (rate, fixed)
    assert abs(sorted(ks[-10:])[5] - best) <= 2, (ks, best)  # drafting, at about the best K
    assert fixed[best] > 2 * pair.plain()  # the draft is worth having


@pytest.mark.parametrize("pair", [
    Pair(agreement=0.2, draft=0.1, slope=0.1),  # cheap, but seldom right
    Pair(agreement=0.5, draft=0.7),  # right half the time, too dear
    Pair(agreement=0.2, draft=0.7, new=64),  # neither, in a short answer
], ids=["seldom-right", "too-dear", "neither"])
def test_a_draft_that_does_not_pay_costs_at_most_the_exploration_share(pair):
    rate, planners, _ = pair.rate(8, adaptive=True)
    assert rate >= 0.97 * pair.plain(), (rate, pair.plain())
    for planner in planners:
        assert 0.0 < planner.explored <= EXPLORE_SHARE * 1.0 * pair.new  # tried, within the cap


def test_a_trial_out_of_budget_leaves_the_draft_to_the_ordinary_rules():
    """The first trial step read a prompt dearer than priced (nothing was measured yet) and
    spent the budget: nothing more is explored, and the draft, which has read, drafts on as
    any started draft does, judged by what it measures; it is not kept out of the answer."""
    planner, reader = Planner(6, book=Book(prefill_cost=0.0001)), Reader(700)  # priced low
    planner.sure(0.01)  # a low prior: the reading would not be repaid on it
    observe(planner, planner.plan(reader, None, 200, 1), 0, 0, 0.0, 0.2)
    plan = planner.plan(reader, None, 199, 2)
    assert plan.guesser == "model" and plan.explore  # tried against its prior
    reader.catch_up = (700, 2.8)
    observe(planner, plan, plan.k, plan.k, 2.8 + 0.05 * plan.k, 0.25)  # and every guess kept
    assert planner.explored > EXPLORE_SHARE * 0.2 * 200  # the budget is spent
    reader.to_read, reader.catch_up = 1, (0, 0.0)
    for made in range(3 + plan.k, 6 + plan.k):
        plan = planner.plan(reader, None, 200 - made, made)
        assert plan.guesser == "model" and not plan.explore
        observe(planner, plan, plan.k, plan.k, 0.05 * plan.k, 0.25)
    for made in range(20, 40):  # then it guesses wrong: plain steps, no probe out of budget
        plan = planner.plan(reader, None, 200 - made, made)
        assert not plan.explore
        observe(planner, plan, plan.k, 0, 0.05 * plan.k, 0.25 if plan.k else 0.2)
    assert plan == PLAIN
