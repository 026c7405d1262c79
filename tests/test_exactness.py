"""The product's promise, proved statistically: sampled speculative output has exactly the
target's distribution. On tiny models (vocabulary 16) the exact joint distribution of the first
new tokens is enumerated from the target alone, then compared with thousands of speculative
draws by a chi-square test. A deliberately broken sampler must fail the same test."""

from __future__ import annotations

import functools
import itertools
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

import specgen.engine
from specgen import SpeculativeGenerator
from specgen.drafters import ModelDrafter
from specgen.sampling import SamplingParams, probs_from_logits, sample
from tiny import distill, sharpen, tiny_model

VOCAB = 16
SAMPLES = 5000
ALPHA = 0.001


@functools.lru_cache(maxsize=None)
def tiny_pair(family: str = "llama"):
    """A peaked target and a draft that differs from it clearly (total variation about
    0.3 on the first token), so that acceptance, rejection and the residual all matter."""
    target = tiny_model(family, vocab=VOCAB, hidden=32, layers=2, seed=10)
    sharpen(target, 10.0)
    draft = tiny_model(family, vocab=VOCAB, hidden=16, layers=1, seed=11)
    sharpen(draft, 5.0)
    distill(draft, target, steps=3)
    return target, draft


PROMPT = torch.tensor([[1, 7, 3, 12, 5]])


@torch.inference_mode()
def target_joint(target, prompt: torch.Tensor, n: int, params: SamplingParams) -> dict[tuple, float]:
    """P(x1..xn) under the target alone, by enumerating every prefix with mass."""
    joint = {(): 1.0}
    for _ in range(n):
        grown = {}
        for prefix, mass in joint.items():
            ids = torch.cat([prompt[0], torch.tensor(prefix, dtype=torch.long)])[None]
            p = probs_from_logits(target(ids).logits[0, -1], params)
            for tok in torch.nonzero(p).flatten().tolist():
                grown[prefix + (tok,)] = mass * p[tok].item()
        joint = grown
    return joint


def chi_square_pvalue(samples: Counter, joint: dict[tuple, float]) -> float:
    """Chi-square goodness of fit; cells expected below 5 are pooled so the test is valid."""
    outside = sum(c for cell, c in samples.items() if cell not in joint)
    assert outside == 0, f"{outside} samples the target can never produce"
    total = sum(samples.values())
    big = [cell for cell, p in joint.items() if p * total >= 5]
    observed = [samples[c] for c in big]
    expected = [joint[c] * total for c in big]
    rest_expected = total - sum(expected)
    if rest_expected > 1e-9:
        observed.append(total - sum(observed))
        expected.append(rest_expected)
    # Float rounding can leave the expected counts a hair off the observed total (relative
    # 1e-8), which chisquare refuses; rescaling by that hair changes nothing statistically.
    expected = [e * sum(observed) / sum(expected) for e in expected]
    return chisquare(observed, expected).pvalue


def draw(gen: SpeculativeGenerator, n: int, params: SamplingParams, samples: int = SAMPLES):
    """`samples` seeded speculative generations: (counts of each output, Counter of sources)."""
    kw = dict(max_new_tokens=n, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
    outputs, sources = Counter(), Counter()
    for i in range(samples):
        result = gen.generate(PROMPT, seed=i, **kw)
        outputs[tuple(result.token_ids)] += 1
        sources.update(result.sources)
    return outputs, sources


CASES = [  # (family, K, new tokens, warping); the first token is the prompt pass's own
    ("llama", 1, 3, SamplingParams(1.0)),
    ("qwen2", 3, 4, SamplingParams(0.8, top_k=4)),
    ("llama", 4, 4, SamplingParams(1.3, top_p=0.7)),
    ("qwen2", 6, 5, SamplingParams(1.0, top_k=3, top_p=0.9)),
]


@pytest.mark.parametrize("family, k, n, params", CASES)
def test_sampled_output_has_the_target_distribution(family, k, n, params):
    target, draft = tiny_pair(family)
    joint = target_joint(target, PROMPT, n, params)
    assert sum(joint.values()) == pytest.approx(1.0, abs=1e-4)
    gen = SpeculativeGenerator(target, draft, num_speculative_tokens=k, adaptive=False)
    samples, sources = draw(gen, n, params)
    # The runs must really exercise the algorithm: acceptances, rejections and bonus tokens.
    assert min(sources["accepted"], sources["resampled"], sources["bonus"]) > SAMPLES // 50
    pvalue = chi_square_pvalue(samples, joint)
    assert pvalue > ALPHA, f"speculative samples differ from the target (p = {pvalue:.2e})"


def test_acceptance_is_exercised_on_the_fixture():
    """Across many draws the fixture pair sees acceptances, rejections and bonus tokens."""
    target, draft = tiny_pair()
    gen = SpeculativeGenerator(target, draft, num_speculative_tokens=2, adaptive=False)
    _, sources = draw(gen, 3, SamplingParams(1.0), samples=300)
    assert sources["accepted"] and sources["resampled"] and sources["bonus"]


def test_broken_sampler_is_caught(monkeypatch):
    """Negative control: a sampler that accepts every draft token emits the draft's
    distribution, and the same test rejects it."""

    def accept_all(p, q, draft_ids, generator=None):
        k = draft_ids.shape[0]
        return k, sample(p[k], generator)

    monkeypatch.setattr(specgen.engine, "rejection_verify", accept_all)
    target, draft = tiny_pair()
    params = SamplingParams(1.0)
    joint = target_joint(target, PROMPT, 3, params)
    gen = SpeculativeGenerator(target, draft, num_speculative_tokens=1, adaptive=False)
    samples, _ = draw(gen, 3, params, samples=2000)
    assert chi_square_pvalue(samples, joint) < ALPHA


def test_chi_square_helper_pools_small_cells():
    joint = {(a, b): 0.25 * (0.97 if b == 0 else 0.01) for a, b in itertools.product(range(4), range(4))}
    samples = Counter({cell: round(p * 4000) for cell, p in joint.items()})
    assert chi_square_pvalue(samples, joint) > 0.5


def test_a_draft_over_part_of_the_vocabulary_keeps_the_target_distribution():
    """A trimmed draft head (head_rows) makes q zero on the other ids; rejection sampling
    must still emit exactly the target's distribution, including those ids."""

    target, draft = tiny_pair("qwen2")
    params = SamplingParams(1.0)
    joint = target_joint(target, PROMPT, 3, params)
    gen = SpeculativeGenerator(target, ModelDrafter(draft, VOCAB, head_rows=10), 3, adaptive=False)
    samples, sources = draw(gen, 3, params)
    assert sources["accepted"] > SAMPLES // 50 and sources["resampled"] > SAMPLES // 50
    assert any(tok >= 10 for cell in samples for tok in cell)  # ids the draft cannot propose
    pvalue = chi_square_pvalue(samples, joint)
    assert pvalue > ALPHA, f"speculative samples differ from the target (p = {pvalue:.2e})"


class StopAt(ModelDrafter):
    """A draft model that always ends its drafts at one `stop_below` threshold."""

    def __init__(self, model, vocab: int, threshold: float) -> None:
        super().__init__(model, vocab)
        self.threshold = threshold

    def propose(self, tokens, k, params, generator, guesser=None, stop_below=0.0):
        return super().propose(tokens, k, params, generator, guesser, self.threshold)


def test_ending_drafts_where_the_whole_draft_becomes_unlikely_keeps_the_target_distribution():
    """Adaptive K's stop (the draft's probability of all its tokens so far) also depends on
    the draft alone: the distribution must not move."""
    target, draft = tiny_pair("llama")
    params = SamplingParams(1.0)
    joint = target_joint(target, PROMPT, 4, params)
    gen = SpeculativeGenerator(target, StopAt(draft, VOCAB, 0.05), 3, adaptive=False)
    first_k = [gen.generate(PROMPT, seed=i, max_new_tokens=4, temperature=1.0).stats.k_per_step[0]
               for i in range(50)]
    assert 1 in first_k and 2 in first_k  # some drafts really end early
    samples, sources = draw(gen, 4, params)
    assert sources["accepted"] > SAMPLES // 50 and sources["resampled"] > SAMPLES // 50
    pvalue = chi_square_pvalue(samples, joint)
    assert pvalue > ALPHA, f"speculative samples differ from the target (p = {pvalue:.2e})"


def test_ending_drafts_at_low_draft_confidence_keeps_the_target_distribution():
    """Where a draft ends depends on the draft's own probabilities; every position is still
    either verified or drawn by the target, so the distribution must not move."""

    target, draft = tiny_pair("llama")
    params = SamplingParams(1.0)
    joint = target_joint(target, PROMPT, 4, params)
    drafter = ModelDrafter(draft, VOCAB, confidence=0.08)
    gen = SpeculativeGenerator(target, drafter, 3, adaptive=False)
    # Some drafts really end early: the first step asks for 2 (4 tokens wanted: the
    # first is the prompt pass's) and gets 1.
    first_k = [gen.generate(PROMPT, seed=i, max_new_tokens=4, temperature=1.0).stats.k_per_step[0]
               for i in range(50)]
    assert 1 in first_k and 2 in first_k
    samples, sources = draw(gen, 4, params)
    assert sources["accepted"] > SAMPLES // 50 and sources["resampled"] > SAMPLES // 50
    pvalue = chi_square_pvalue(samples, joint)
    assert pvalue > ALPHA, f"speculative samples differ from the target (p = {pvalue:.2e})"

