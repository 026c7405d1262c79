"""The adaptive-K policy: its cost model and choices, on made-up measurements."""

import pytest

from specgen.adaptive import AdaptiveK, FixedK, choose_guesser, expected_tokens, verify_curve


def test_verify_cost_of_unmeasured_widths_from_the_measured_ones():
    costs = {0: 1.0, 4: 3.0, 8: 3.4}
    assert verify_curve(costs, 2) == pytest.approx(2.0)  # between neighbours: linear
    assert verify_curve(costs, 6) == pytest.approx(3.2)
    assert verify_curve(costs, 12) == pytest.approx(3.4)  # beyond the widest: flat
    assert verify_curve({4: 0.2}, 0) == pytest.approx(0.2)


def test_the_plain_step_cost_is_measured_before_it_is_compared():
    policy = AdaptiveK(4)
    assert policy.choose(100) == 2  # a short speculative step first
    assert AdaptiveK(1).choose(100) == 1 and AdaptiveK(0).choose(100) == 0
    policy.update(2, 2, 0.4, 2.4)
    assert policy.choose(100) == 0  # then one plain step, whatever the acceptance
    policy.update(0, 0, 0.0, 0.7)
    assert policy.verify_cost[0] == pytest.approx(0.7)


def feed(policy: AdaptiveK, k: int, n: int, draft_s: float, verify_s: float, times: int = 30):
    for _ in range(times):
        policy.update(k, n, draft_s * k, verify_s)


def test_speculation_switches_off_when_the_draft_is_too_dear_for_its_acceptance():
    policy = AdaptiveK(6)
    feed(policy, 4, 0, draft_s=0.08, verify_s=0.18)  # nothing accepted
    assert policy.choose(100) == 0


def test_high_acceptance_and_a_flat_verify_cost_choose_long_drafts():
    policy = AdaptiveK(6)
    feed(policy, 6, 6, draft_s=0.02, verify_s=0.18)  # every draft accepted, draft cheap
    policy.verify_cost[0] = 0.17
    policy.verify_cost[1] = 0.175
    assert policy.choose(100) == 6
    assert policy.choose(2) == 2  # never more than are still wanted


def test_dear_verification_shortens_drafts():
    """fp32 on a CPU: a pass over k+1 tokens costs about k+1 steps, so long drafts lose."""
    cheap, dear = AdaptiveK(6), AdaptiveK(6)
    for policy, per_token in ((cheap, 0.002), (dear, 0.17)):
        for k in (0, 1, 4, 6):
            feed(policy, k, k - 1, draft_s=0.03, verify_s=0.17 + per_token * k, times=10)
    assert dear.choose(100) < cheap.choose(100)


def switched_off(k_max: int = 6) -> AdaptiveK:
    """A policy that has seen the draft never guess right, and has measured a plain step."""
    policy = AdaptiveK(k_max)
    feed(policy, 4, 0, draft_s=0.08, verify_s=0.18)
    policy.update(0, 0, 0.0, 0.17)
    return policy


def test_failed_probes_wait_longer_and_probe_with_one_draft():
    policy = switched_off()
    assert policy.wait == policy.probe_every
    ks = []
    for _ in range(600):
        k = policy.choose(100)
        ks.append(k)
        if k:
            policy.update(k, 0, 0.08, 0.18)  # the probe fails
    assert sorted(set(ks)) == [0, 1]  # a probe drafts one token
    probes = [i for i, k in enumerate(ks) if k]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert probes[0] == 15 and gaps[:4] == [32, 64, 128, 128]  # each failed probe doubles the wait, up to 128


def test_rejections_while_speculating_do_not_delay_the_first_probe():
    policy = switched_off()  # every one of its 30 speculative steps was rejected
    assert policy.wait == policy.probe_every
    ks = [policy.choose(100) for _ in range(policy.probe_every)]
    assert ks[-1] == 1 and sum(ks) == 1  # the 16th step is the first probe


def test_a_probe_that_succeeds_resets_the_wait():
    policy = switched_off()
    policy.wait = policy.max_probe_every
    policy.update(1, 1, 0.08, 0.18)
    assert policy.wait == policy.probe_every


def test_the_next_guesser_drafts_when_the_first_declines():
    keen = AdaptiveK(6)
    feed(keen, 4, 4, draft_s=0.01, verify_s=0.18)  # every draft kept, drafting cheap
    keen.update(0, 0, 0.0, 0.17)
    policies = {"lookup": switched_off(), "model": keen}
    guesser, k = choose_guesser(policies, ("lookup", "model"), 100)
    assert guesser == "model" and k > 0
    assert choose_guesser({"lookup": FixedK(3), "model": keen}, ("lookup", "model"), 100) == ("lookup", 3)
    assert choose_guesser({"model": switched_off()}, ("model",), 100) == ("model", 0)  # a plain step


def test_expected_tokens():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
