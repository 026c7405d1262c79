"""The product's promise, proved statistically: sampled speculative output has exactly the
target's distribution. On tiny models (vocabulary 16) the exact joint distribution of the first
new tokens is enumerated from the target alone, then compared with thousands of speculative
draws by a chi-square test. A deliberately broken sampler must fail the same test."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

import specgen.core.engine
from specgen import SpeculativeGenerator
from specgen.core.drafters import ModelDrafter
from specgen.core.sampling import SamplingParams, sample

CASES = [  # (family, K, new tokens, warping); the first token is the prompt pass's own
    ("llama", 1, 3, SamplingParams(1.0)),
    ("qwen2", 3, 4, SamplingParams(0.8, top_k=4)),
    ("llama", 4, 4, SamplingParams(1.3, top_p=0.7)),
    ("qwen2", 6, 5, SamplingParams(1.0, top_k=3, top_p=0.9)),
]


@pytest.mark.parametrize("family, k, n, params", CASES)
def test_sampled_output_has_the_target_distribution(family, k, n, params, distribution):
    target, draft = distribution.tiny_pair(family)
    joint = distribution.target_joint(target, distribution.PROMPT, n, params)
    assert sum(joint.values()) == pytest.approx(1.0, abs=1e-4)
    gen = SpeculativeGenerator(target, draft, num_speculative_tokens=k, adaptive=False)
    samples, sources = distribution.draw(gen, n, params)
    # The runs must really exercise the algorithm: acceptances, rejections and bonus tokens.
    assert min(sources["accepted"], sources["resampled"], sources["bonus"]) > distribution.SAMPLES // 50
    pvalue = distribution.chi_square_pvalue(samples, joint)
    assert pvalue > distribution.ALPHA, f"speculative samples differ from the target (p = {pvalue:.2e})"


def test_acceptance_is_exercised_on_the_fixture(distribution):
    """Across many draws the fixture pair sees acceptances, rejections and bonus tokens."""
    target, draft = distribution.tiny_pair()
    gen = SpeculativeGenerator(target, draft, num_speculative_tokens=2, adaptive=False)
    _, sources = distribution.draw(gen, 3, SamplingParams(1.0), samples=300)
    assert sources["accepted"] and sources["resampled"] and sources["bonus"]


def test_broken_sampler_is_caught(monkeypatch, distribution):
    """Negative control: a sampler that accepts every draft token emits the draft's
    distribution, and the same test rejects it."""

    def accept_all(p, q, draft_ids, generator=None):
        k = draft_ids.shape[0]  # as rejection_accept answers: the count as a tensor
        return torch.tensor(k, device=p.device), sample(p[k], generator)

    monkeypatch.setattr(specgen.core.engine, "rejection_accept", accept_all)
    target, draft = distribution.tiny_pair()
    params = SamplingParams(1.0)
    joint = distribution.target_joint(target, distribution.PROMPT, 3, params)
    gen = SpeculativeGenerator(target, draft, num_speculative_tokens=1, adaptive=False)
    samples, _ = distribution.draw(gen, 3, params, samples=2000)
    assert distribution.chi_square_pvalue(samples, joint) < distribution.ALPHA


def test_chi_square_helper_pools_small_cells(distribution):
    joint = {(a, b): 0.25 * (0.97 if b == 0 else 0.01) for a, b in itertools.product(range(4), range(4))}
    samples = Counter({cell: round(p * 4000) for cell, p in joint.items()})
    assert distribution.chi_square_pvalue(samples, joint) > 0.5


def test_a_draft_over_part_of_the_vocabulary_keeps_the_target_distribution(distribution):
    """A trimmed draft head (head_rows) makes q zero on the other ids; rejection sampling
    must still emit exactly the target's distribution, including those ids."""

    target, draft = distribution.tiny_pair("qwen2")
    params = SamplingParams(1.0)
    joint = distribution.target_joint(target, distribution.PROMPT, 3, params)
    gen = SpeculativeGenerator(target, ModelDrafter(draft, distribution.VOCAB, head_rows=10), 3, adaptive=False)
    samples, sources = distribution.draw(gen, 3, params)
    assert sources["accepted"] > distribution.SAMPLES // 50 and sources["resampled"] > distribution.SAMPLES // 50
    assert any(tok >= 10 for cell in samples for tok in cell)  # ids the draft cannot propose
    pvalue = distribution.chi_square_pvalue(samples, joint)
    assert pvalue > distribution.ALPHA, f"speculative samples differ from the target (p = {pvalue:.2e})"


def test_ending_drafts_where_the_whole_draft_becomes_unlikely_keeps_the_target_distribution(distribution):
    """Adaptive K's stop (the draft's probability of all its tokens so far) also depends on
    the draft alone: the distribution must not move."""
    target, draft = distribution.tiny_pair("llama")
    params = SamplingParams(1.0)
    joint = distribution.target_joint(target, distribution.PROMPT, 4, params)
    gen = SpeculativeGenerator(target, distribution.StopAt(draft, distribution.VOCAB, 0.05), 3, adaptive=False)
    first_k = [gen.generate(distribution.PROMPT, seed=i, max_new_tokens=4, temperature=1.0).stats.k_per_step[0]
               for i in range(50)]
    assert 1 in first_k and 2 in first_k  # some drafts really end early
    samples, sources = distribution.draw(gen, 4, params)
    assert sources["accepted"] > distribution.SAMPLES // 50 and sources["resampled"] > distribution.SAMPLES // 50
    pvalue = distribution.chi_square_pvalue(samples, joint)
    assert pvalue > distribution.ALPHA, f"speculative samples differ from the target (p = {pvalue:.2e})"


def test_ending_drafts_at_low_draft_confidence_keeps_the_target_distribution(distribution):
    """Where a draft ends depends on the draft's own probabilities; every position is still
    either verified or drawn by the target, so the distribution must not move."""

    target, draft = distribution.tiny_pair("llama")
    params = SamplingParams(1.0)
    joint = distribution.target_joint(target, distribution.PROMPT, 4, params)
    drafter = ModelDrafter(draft, distribution.VOCAB, confidence=0.08)
    gen = SpeculativeGenerator(target, drafter, 3, adaptive=False)
    # Some drafts really end early: the first step asks for 2 (4 tokens wanted: the
    # first is the prompt pass's) and gets 1.
    first_k = [gen.generate(distribution.PROMPT, seed=i, max_new_tokens=4, temperature=1.0).stats.k_per_step[0]
               for i in range(50)]
    assert 1 in first_k and 2 in first_k
    samples, sources = distribution.draw(gen, 4, params)
    assert sources["accepted"] > distribution.SAMPLES // 50 and sources["resampled"] > distribution.SAMPLES // 50
    pvalue = distribution.chi_square_pvalue(samples, joint)
    assert pvalue > distribution.ALPHA, f"speculative samples differ from the target (p = {pvalue:.2e})"

