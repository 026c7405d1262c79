"""The pure math of sampling.py, edge cases included."""

from collections import Counter

import pytest
import torch

from specgen.errors import ConfigError
from specgen.core.sampling import (
    SamplingParams,
    greedy_verify,
    multi_rejection_accept,
    probs_from_logits,
    rejection_verify,
    residual,
    sample,
    top_probability,
    tree_greedy_accept,
    warp_logits,
)


def test_params_validation():
    with pytest.raises(ConfigError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ConfigError, match="top-k"):
        SamplingParams(1.0, top_k=-1)
    for bad in (0.0, 1.5, -0.2):
        with pytest.raises(ConfigError, match="top-p"):
            SamplingParams(1.0, top_p=bad)
    assert SamplingParams().greedy and not SamplingParams(0.5).greedy


def test_top_k_keeps_k_largest():
    logits = torch.tensor([1.0, 5.0, 3.0, 4.0, 2.0])
    p = probs_from_logits(logits, SamplingParams(1.0, top_k=2))
    assert (p > 0).tolist() == [False, True, False, True, False]
    assert p.sum().item() == pytest.approx(1.0)


def test_top_k_one_is_argmax():
    logits = torch.randn(3, 10)
    p = probs_from_logits(logits, SamplingParams(0.7, top_k=1))
    assert torch.equal(p.argmax(-1), logits.argmax(-1))
    assert torch.allclose(p.max(-1).values, torch.ones(3))


def test_top_p_keeps_smallest_prefix_reaching_mass():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    kept = probs_from_logits(logits, SamplingParams(1.0, top_p=0.8)) > 0
    assert kept.tolist() == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    kept = probs_from_logits(logits, SamplingParams(1.0, top_p=0.81)) > 0
    assert kept.tolist() == [True, True, True, False]


def test_top_p_cutting_to_one_token():
    logits = torch.tensor([0.0, 4.0, 1.0])
    p = probs_from_logits(logits, SamplingParams(1.0, top_p=0.5))
    assert p.tolist() == [0.0, 1.0, 0.0]


def test_temperature_sharpens():
    logits = torch.tensor([1.0, 2.0])
    hot = probs_from_logits(logits, SamplingParams(2.0))
    cold = probs_from_logits(logits, SamplingParams(0.5))
    assert cold[1] > hot[1] > 0.5


def test_warp_is_identity_without_filters():
    logits = torch.randn(7)
    assert torch.allclose(warp_logits(logits, SamplingParams(1.0)), logits)


def test_sample_frequencies_follow_probs():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.1, 0.6, 0.0, 0.3])
    draws = sample(probs.expand(20000, 4), g)
    freq = torch.bincount(draws, minlength=4).float() / 20000
    assert freq[2] == 0
    assert torch.allclose(freq, probs, atol=0.015)


def test_residual_normalises_positive_part():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.5, 0.3])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))


def test_residual_without_mass_falls_back_to_p():
    p = torch.tensor([0.25, 0.75])
    assert torch.equal(residual(p, p.clone()), p)


def test_greedy_verify_all_accepted_gives_bonus():
    logits = torch.nn.functional.one_hot(torch.tensor([3, 1, 4]), 6).float()
    n, nxt = greedy_verify(logits, torch.tensor([3, 1]))
    assert (n, nxt.item()) == (2, 4)


def test_greedy_verify_first_rejected():
    logits = torch.nn.functional.one_hot(torch.tensor([3, 1, 4]), 6).float()
    n, nxt = greedy_verify(logits, torch.tensor([2, 1]))
    assert (n, nxt.item()) == (0, 3)  # the later match does not count after a rejection


def test_greedy_verify_k1_and_k0():
    logits = torch.nn.functional.one_hot(torch.tensor([5, 0]), 6).float()
    assert greedy_verify(logits, torch.tensor([5]))[0] == 1
    n, nxt = greedy_verify(logits[:1], torch.tensor([], dtype=torch.long))
    assert (n, nxt.item()) == (0, 5)


def test_rejection_accepts_when_p_equals_q():
    g = torch.Generator().manual_seed(1)
    q = torch.softmax(torch.randn(4, 8), -1)
    p = torch.cat([q, torch.softmax(torch.randn(1, 8), -1)])
    drafts = sample(q, g)
    for _ in range(200):
        n, _ = rejection_verify(p, q, drafts, g)
        assert n == 4  # p/q == 1: never rejected, the bonus comes from p[K]


def test_rejection_rejects_tokens_target_cannot_emit():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        n, nxt = rejection_verify(p, q, torch.tensor([0]), g)
        assert (n, nxt.item()) == (0, 1)  # first rejected; residual puts all mass on 1


def test_rejection_single_position_distribution():
    """One step with K = 1: the first emitted token must follow p[0] exactly."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[0.1, 0.1, 0.8]])
    counts = torch.zeros(3)
    for _ in range(6000):
        d = sample(q, g)
        n, nxt = rejection_verify(p, q, d, g)
        counts[(d[0] if n == 1 else nxt).item()] += 1
    assert torch.allclose(counts / counts.sum(), p[0], atol=0.02)


def test_rejection_with_one_hot_draft():
    """A deterministic drafter (q one-hot) is exact too: accept with probability p(x)."""
    g = torch.Generator().manual_seed(3)
    p = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    q = torch.tensor([[0.0, 1.0]])
    counts = torch.zeros(2)
    for _ in range(6000):
        n, nxt = rejection_verify(p, q, torch.tensor([1]), g)
        counts[1 if n == 1 else nxt.item()] += 1
    assert torch.allclose(counts / counts.sum(), p[0], atol=0.02)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_top_probability_is_the_softmax_of_the_likeliest_token(dtype):
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0)).mul(4).to(dtype)
    expected = logits.float().softmax(-1).max()
    assert top_probability(logits).item() == pytest.approx(expected.item(), rel=1e-5)
    assert top_probability(torch.zeros(4)).item() == pytest.approx(0.25)
    assert top_probability(torch.tensor([0.0, 1e4, -1e4])).item() == pytest.approx(1.0)


def first_token_distributions(distribution, params):
    """The tiny pair's p and q at the first new position (they differ clearly)."""
    target, draft = distribution.tiny_pair()
    with torch.inference_mode():
        p = probs_from_logits(target(distribution.PROMPT).logits[0, -1], params)
        q = probs_from_logits(draft(distribution.PROMPT).logits[0, -1], params)
    return p, q


def draw_from_candidates(accept, p, q, m, samples):
    g = torch.Generator().manual_seed(0)
    counts, tried = Counter(), Counter()
    for _ in range(samples):
        candidates = sample(q.expand(m, -1).contiguous(), g)
        index, token = accept(p, q, candidates, g)
        counts[(token.item(),)] += 1
        tried[index.item()] += 1
    return counts, tried


@pytest.mark.parametrize("m", [1, 3])
def test_multi_candidate_rejection_sampling_emits_the_target_distribution(distribution, m):
    p, q = first_token_distributions(distribution, SamplingParams(1.0))
    samples, tried = draw_from_candidates(multi_rejection_accept, p, q, m, distribution.SAMPLES)
    assert len(tried) == m + 1  # every candidate accepted sometimes, and the draw after all
    joint = {(t,): p[t].item() for t in range(len(p)) if p[t] > 0}
    pvalue = distribution.chi_square_pvalue(samples, joint)
    assert pvalue > distribution.ALPHA, f"candidates' tokens differ from the target (p = {pvalue:.2e})"


def test_multi_candidate_without_the_residual_is_caught(distribution):
    """Negative control: trying every candidate against p itself (no residual after a
    rejection) favours what the draft proposes, and the same test rejects it."""

    def no_residual(p, q, candidates, generator=None):
        for i, x in enumerate(candidates):
            if torch.rand(1, generator=generator) * q[x] < p[x]:
                return torch.tensor(i), x
        return torch.tensor(len(candidates)), sample(p, generator)

    p, q = first_token_distributions(distribution, SamplingParams(1.0))
    samples, _ = draw_from_candidates(no_residual, p, q, 3, 2000)
    joint = {(t,): p[t].item() for t in range(len(p)) if p[t] > 0}
    assert distribution.chi_square_pvalue(samples, joint) < distribution.ALPHA


def test_multi_candidate_rejection_edge_cases():
    g = torch.Generator().manual_seed(1)
    p, q = torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.5, 0.0, 0.5])
    index, token = multi_rejection_accept(p, q, torch.tensor([0, 2]), g)
    assert (index.item(), token.item()) == (2, 1)  # both impossible for p: its own token
    index, token = multi_rejection_accept(p, q, torch.empty(0, dtype=torch.long), g)
    assert (index.item(), token.item()) == (0, 1)  # no candidates: a draw from p
    index, token = multi_rejection_accept(q, q, torch.tensor([2, 0]), g)
    assert (index.item(), token.item()) == (0, 2)  # p == q: the first is always kept


def test_tree_greedy_verify_on_a_chain_is_greedy_verify():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(5, 6, generator=g)
        drafts = torch.randint(0, 6, (4,), generator=g)
        drafts[:2] = logits[:2].argmax(-1)  # a kept prefix, often longer
        n, leaf, token = tree_greedy_accept(logits, [-1, 0, 1, 2, 3], torch.cat([drafts[:1], drafts]))
        assert (n.item(), token.item()) == tuple(x if isinstance(x, int) else x.item()
                                                 for x in greedy_verify(logits, drafts))
        assert leaf.item() == n.item()


def test_tree_greedy_verify_follows_the_branch_the_target_takes():
    """Root 0 with children 1 (token 3) and 2 (token 4); node 2 has children 3 (token 1)
    and 4 (token 2); node 4 has child 5 (token 0). The target takes 4, then 2, then 5."""
    parents, tokens = [-1, 0, 0, 2, 2, 4], torch.tensor([9, 3, 4, 1, 2, 0])
    logits = torch.full((6, 10), -1.0)
    for row, best in enumerate([4, 7, 2, 7, 5, 7]):
        logits[row, best] = 1.0
    n, leaf, token = tree_greedy_accept(logits, parents, tokens)
    assert (n.item(), leaf.item(), token.item()) == (2, 4, 5)  # 4, 2 kept; then its own 5
    logits[0] = 0.0
    logits[0, 3] = 1.0  # the target takes 3: the other branch, a leaf
    n, leaf, token = tree_greedy_accept(logits, parents, tokens)
    assert (n.item(), leaf.item(), token.item()) == (1, 1, 7)
