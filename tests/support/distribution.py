"""Helpers of the distribution tests (the `distribution` fixture): a tiny pair whose draft
differs clearly from its target (tiny_pair, over VOCAB tokens), the target's exact joint
distribution of the first tokens by enumeration (target_joint), a chi-square test against it
(chi_square_pvalue, at level ALPHA), seeded speculative draws (draw: SAMPLES runs from PROMPT),
and a draft that ends its drafts at one threshold (StopAt)."""

from __future__ import annotations

import functools
from collections import Counter

import torch
from scipy.stats import chisquare

from specgen import SpeculativeGenerator
from specgen.core.drafters import ModelDrafter
from specgen.core.sampling import SamplingParams, probs_from_logits
from .tiny import distill, sharpen, tiny_model

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


class StopAt(ModelDrafter):
    """A draft model that always ends its drafts at one `stop_below` threshold."""

    def __init__(self, model, vocab: int, threshold: float) -> None:
        super().__init__(model, vocab)
        self.threshold = threshold

    def propose(self, tokens, k, params, generator, stop_below=0.0):
        return super().propose(tokens, k, params, generator, self.threshold)
