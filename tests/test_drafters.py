"""Drafters without a draft model: the n-gram matcher, prompt lookup, the hybrid drafter,
make_drafter, and greedy exactness of the engine with each of them."""

from collections import Counter

import pytest
import torch

from specgen.core.adaptive import FIRST_STOP, Planner
from specgen.core.step import Plan
from specgen.core.drafters import (
    HybridDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    make_drafter,
    ngram_match,
)
from specgen.core.engine import SpeculativeGenerator
from specgen.errors import ConfigError
from specgen.core.sampling import SamplingParams

GREEDY = SamplingParams()


def lookup(tokens: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    ids, q = PromptLookupDrafter(max_ngram, min_ngram).propose(torch.tensor(tokens), k, GREEDY, None)
    assert q is None  # deterministic: one-hot
    return ids.tolist()


# --- the n-gram matcher ---------------------------------------------------------------------


def test_longest_match_wins_over_a_more_recent_shorter_one():
    # Tail (1, 2, 3) occurs at the start; "3" alone occurs more recently, followed by 11.
    assert lookup([1, 2, 3, 10, 20, 7, 3, 11, 1, 2, 3], k=3) == [10, 20, 7]


def test_most_recent_occurrence_wins_among_equal_lengths():
    assert lookup([1, 2, 10, 1, 2, 11, 5, 1, 2], k=2) == [11, 5]


def test_max_ngram_bounds_the_match_length():
    # With max_ngram = 1 only the last token is matched: its most recent occurrence wins.
    assert lookup([1, 2, 3, 10, 7, 3, 11, 1, 2, 3], k=1, max_ngram=1) == [11]
    assert lookup([1, 2, 3, 10, 7, 3, 11, 1, 2, 3], k=1, max_ngram=3) == [10]


def test_min_ngram_respected():
    assert lookup([4, 2, 9, 2], k=2, min_ngram=1) == [9, 2]
    assert lookup([4, 2, 9, 2], k=2, min_ngram=2) == []
    assert lookup([4, 2, 9, 4, 2], k=2, min_ngram=2) == [9, 4]


def test_continuation_truncated_at_context_end():
    assert lookup([1, 2, 3, 1, 2], k=5) == [3, 1, 2]
    assert lookup([5, 5, 5], k=4) == [5]  # tail (5, 5) last seen ending one token back


def test_k_limits_the_proposal():
    tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert lookup(tokens, k=2) == [3, 4]
    assert lookup(tokens, k=8) == [3, 4, 5, 6, 7, 1, 2]
    assert lookup(tokens, k=0) == []


def test_no_match_proposes_nothing():
    assert lookup([1, 2, 3, 4], k=4) == []
    assert lookup([7], k=4) == []


def test_matcher_agrees_with_brute_force():
    def brute(tokens: list[int], max_ngram: int, min_ngram: int) -> tuple[int, int]:
        t = len(tokens)
        for n in range(max_ngram, min_ngram - 1, -1):
            if n >= t:
                continue
            tail = tokens[t - n :]
            for end in range(t - 2, n - 2, -1):  # most recent first, never the tail itself
                if tokens[end - n + 1 : end + 1] == tail:
                    return n, end + 1
        return 0, 0

    rng = torch.Generator().manual_seed(0)
    for trial in range(300):
        length = int(torch.randint(1, 40, (1,), generator=rng))
        vocab = int(torch.randint(2, 8, (1,), generator=rng))
        tokens = torch.randint(vocab, (length,), generator=rng)
        max_ngram = 1 + trial % 5
        min_ngram = 1 + (trial // 5) % max_ngram
        expected = brute(tokens.tolist(), max_ngram, min_ngram)
        assert ngram_match(tokens, max_ngram, min_ngram) == expected, (tokens, max_ngram, min_ngram)


def test_lookup_validates_ngram_bounds():
    for max_ngram, min_ngram in ((3, 0), (2, 3), (0, 0)):
        with pytest.raises(ConfigError, match="min_ngram"):
            PromptLookupDrafter(max_ngram, min_ngram)


def test_lookup_costs_no_forward_passes():
    drafter = PromptLookupDrafter()
    drafter.propose(torch.tensor([1, 2, 1]), 4, GREEDY, None)
    assert drafter.forward_passes == 0 and drafter.matches == 1


# --- make_drafter and the hybrid ------------------------------------------------------------


def test_make_drafter_methods(tiny_model):
    draft = tiny_model("llama", seed=1)
    assert isinstance(make_drafter("prompt-lookup", None, 64), PromptLookupDrafter)
    assert isinstance(make_drafter("draft-model", draft, 64), ModelDrafter)
    hybrid = make_drafter("hybrid", draft, 64, max_ngram=4, min_ngram=2)
    assert isinstance(hybrid, HybridDrafter)
    assert (hybrid.lookup_drafter.max_ngram, hybrid.lookup_drafter.min_ngram) == (4, 2)


def test_make_drafter_errors():
    with pytest.raises(ConfigError, match="Unknown drafting method 'lookahead'"):
        make_drafter("lookahead", None, 64)
    with pytest.raises(ConfigError, match="needs a draft model"):
        make_drafter("draft-model", None, 64)
    # hybrid without a draft model drafts with lookup, then the target itself (test_self.py)
    with pytest.raises(ConfigError, match="min_ngram"):
        make_drafter("prompt-lookup", None, 64, max_ngram=1, min_ngram=2)


def test_hybrid_falls_back_to_model_and_keeps_its_cache_consistent(tiny_model):
    draft = tiny_model("llama", seed=1)
    hybrid = HybridDrafter(ModelDrafter(draft, 64), PromptLookupDrafter())
    # No repeated token: no match, so the model drafts (and its cache holds the context).
    context = torch.arange(10, 20)
    ids, _ = hybrid.propose(context, 3, GREEDY, None)
    assert hybrid.forward_passes == 3 and hybrid.lookup_drafter.matches == 0
    # Accept one draft plus a token that repeats: lookup drafts, the model is not run.
    context = torch.cat([context, ids[:1], torch.tensor([12])])
    hybrid.rollback(11)
    ids, q = hybrid.propose(context, 3, GREEDY, None)
    assert ids.tolist() == [13, 14, 15] and q is None and hybrid.forward_passes == 3
    # Lookup's drafts rejected, new unseen tokens: the model catches up in one forward and
    # drafts exactly what a fresh drafter would from the same context.
    context = torch.cat([context, torch.tensor([40, 41])])
    hybrid.rollback(12)
    ids, _ = hybrid.propose(context, 3, GREEDY, None)
    assert hybrid.forward_passes == 6
    fresh, _ = ModelDrafter(draft, 64).propose(context, 3, GREEDY, None)
    assert torch.equal(ids, fresh)


def test_hybrid_model_reads_the_whole_context_in_its_first_pass(tiny_model):
    draft = tiny_model("llama", seed=1)
    hybrid = HybridDrafter(ModelDrafter(draft, 64), PromptLookupDrafter())
    context = torch.tensor([10, 11, 12, 13, 10, 11])
    ids, _ = hybrid.guessers(context)["model"].propose(context, 2, GREEDY, None)
    assert hybrid.model_drafter.lm.length == len(context) + 1 and hybrid.forward_passes == 2
    assert torch.equal(ids, ModelDrafter(draft, 64).propose(context, 2, GREEDY, None)[0])


def test_hybrid_offers_lookup_first_only_on_a_match_and_drafts_with_the_chosen_guesser(tiny_model):
    hybrid = HybridDrafter(ModelDrafter(tiny_model("llama", seed=1), 64), PromptLookupDrafter())
    assert tuple(hybrid.guessers(torch.arange(10, 20))) == ("model",)
    context = torch.tensor([10, 11, 12, 13, 10, 11])
    assert tuple(hybrid.guessers(context)) == ("lookup-2", "model")  # named by the match's length
    guessers = hybrid.guessers(context)
    ids, q = guessers["lookup-2"].propose(context, 2, GREEDY, None)
    assert ids.tolist() == [12, 13] and q is None and hybrid.forward_passes == 0
    ids, _ = guessers["model"].propose(context, 2, GREEDY, None)  # a match, but the model drafts
    assert hybrid.forward_passes == 2 and hybrid.lookup_drafter.matches == 1
    assert hybrid.propose(context, 2, GREEDY, None)[0].tolist() == [12, 13]  # unplanned: lookup


def test_hybrid_searches_the_context_once_a_step(monkeypatch, tiny_model):
    from specgen.core import drafters

    calls = []
    real = drafters.ngram_match
    monkeypatch.setattr(drafters, "ngram_match", lambda *a: (calls.append(a), real(*a))[1])
    hybrid = HybridDrafter(ModelDrafter(tiny_model("llama", seed=1), 64), PromptLookupDrafter())
    context = torch.tensor([10, 11, 12, 13, 10, 11])
    guessers = hybrid.guessers(context)
    assert tuple(guessers) == ("lookup-2", "model")
    assert guessers["lookup-2"].propose(context, 2, GREEDY, None)[0].tolist() == [12, 13]
    assert len(calls) == 1
    hybrid.guessers(torch.cat([context, torch.tensor([12])]))  # a new context: a new search
    assert len(calls) == 2


# --- exactness: greedy output is the target's, token for token ------------------------------


def repetitive_prompt(seed: int) -> torch.Tensor:
    """A random phrase repeated with small edits, so that n-grams recur (as in code edits)."""
    g = torch.Generator().manual_seed(seed)
    phrase = torch.randint(64, (12,), generator=g)
    edited = phrase.clone()
    edited[5] = (edited[5] + 1) % 64
    return torch.cat([phrase, edited, phrase[:4]])


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tiny_model, sharpen):
    target = tiny_model(request.param, seed=0)
    draft = tiny_model(request.param, seed=1)
    sharpen(target, 4.0)  # peaked target: its greedy text repeats, as real text does
    sharpen(draft, 4.0)
    return target, draft


N_NEW = 32
PROMPT_SEEDS = (0, 1)


@pytest.fixture(scope="module")
def expected(pair):
    target, _ = pair
    return {
        seed: target.generate(
            repetitive_prompt(seed)[None], do_sample=False, max_new_tokens=N_NEW
        )[0, len(repetitive_prompt(seed)) :].tolist()
        for seed in PROMPT_SEEDS
    }


@pytest.mark.parametrize("method", ["prompt-lookup", "hybrid"])
def test_greedy_equals_target_greedy(pair, expected, method):
    target, draft = pair
    proposed = accepted = 0
    for k in range(1, 9):
        for adaptive in (False, True):
            drafter = make_drafter(method, draft, 64)
            gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=k, adaptive=adaptive)
            for seed in PROMPT_SEEDS:
                result = gen.generate(repetitive_prompt(seed), max_new_tokens=N_NEW)
                assert result.token_ids == expected[seed], (k, adaptive, seed)
                assert result.stats.new_tokens == N_NEW
                proposed += result.stats.proposed
                accepted += result.stats.accepted
    # Lookup really drafted, and the target really kept some of its guesses.
    assert proposed > 0 and accepted > 0


def test_hybrid_uses_both_drafters_and_stays_exact(pair, expected):
    target, draft = pair
    drafter = make_drafter("hybrid", draft, 64)
    gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=4, adaptive=False)
    # A prompt with no repeated token: the first steps must use the draft model.
    prompt = torch.randperm(64, generator=torch.Generator().manual_seed(3))[:20]
    result = gen.generate(prompt, max_new_tokens=N_NEW)
    reference = target.generate(prompt[None], do_sample=False, max_new_tokens=N_NEW)[0, 20:]
    assert result.token_ids == reference.tolist()
    assert result.stats.draft_passes > 0 and drafter.lookup_drafter.matches > 0


def test_hybrid_exact_across_chat_turns(pair):
    """A second prompt extending the first reuses both caches: the model drafter is rolled
    back to the shared prefix and must still catch up correctly."""
    target, draft = pair
    gen = SpeculativeGenerator(target, make_drafter("hybrid", draft, 64), 3, adaptive=True)
    first = repetitive_prompt(0)
    out = gen.generate(first, max_new_tokens=20).token_ids
    second = torch.cat([first, torch.tensor(out[:15]), repetitive_prompt(1)[:6]])
    result = gen.generate(second, max_new_tokens=20)
    reference = target.generate(second[None], do_sample=False, max_new_tokens=20)
    assert result.token_ids == reference[0, len(second) :].tolist()
    assert result.stats.prefill_tokens < len(second) - 1  # the cache really was reused


# --- exactness: sampled output has the target's distribution --------------------------------

def lookup_prompt(target) -> torch.Tensor:
    """The target's own greedy text after (3, 9), then (3, 9) again: lookup proposes that
    text from step one, and the target agrees with it often enough to accept some."""
    head = torch.tensor([[3, 9]])
    return torch.cat([target.generate(head, do_sample=False, max_new_tokens=6), head], 1)


@pytest.mark.parametrize(
    "method, family, k, n, params",
    [
        ("prompt-lookup", "llama", 3, 3, SamplingParams(1.0)),
        ("prompt-lookup", "qwen2", 2, 4, SamplingParams(0.8, top_k=4)),
        ("hybrid", "llama", 4, 3, SamplingParams(1.3, top_p=0.7)),
        ("hybrid", "qwen2", 3, 3, SamplingParams(1.0, top_k=3, top_p=0.9)),
    ],
)
def test_sampled_output_has_the_target_distribution(method, family, k, n, params, distribution):
    target, draft = distribution.tiny_pair(family)
    prompt = lookup_prompt(target)
    joint = distribution.target_joint(target, prompt, n, params)
    drafter = make_drafter(method, draft, distribution.VOCAB)
    gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=k, adaptive=False)
    kw = dict(max_new_tokens=n, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
    samples, sources = Counter(), Counter()
    draft_passes = 0
    for i in range(distribution.SAMPLES):
        result = gen.generate(prompt, seed=i, **kw)
        samples[tuple(result.token_ids)] += 1
        sources.update(result.sources)
        draft_passes += result.stats.draft_passes
    # Lookup's one-hot drafts were both kept and replaced; the hybrid also ran its model.
    assert min(sources["accepted"], sources["resampled"], sources["bonus"]) > distribution.SAMPLES // 50
    assert drafter.lookup_drafter.matches if method == "hybrid" else drafter.matches
    assert (draft_passes > 0) == (method == "hybrid")
    pvalue = distribution.chi_square_pvalue(samples, joint)
    assert pvalue > distribution.ALPHA, f"speculative samples differ from the target (p = {pvalue:.2e})"


def test_trimmed_draft_head_proposes_only_its_rows_and_stays_exact(pair, expected):
    target, draft = pair
    drafter = ModelDrafter(draft, 64, head_rows=40)
    context = repetitive_prompt(0)
    ids, _ = drafter.propose(context, 6, GREEDY, None)
    assert ids.max() < 40
    full_logits = draft(context[None]).logits[0, -1]
    assert ids[0] == full_logits[:40].argmax()  # the same model, over the kept rows
    gen = SpeculativeGenerator(target, ModelDrafter(draft, 64, head_rows=40), 4, adaptive=True)
    for seed in PROMPT_SEEDS:
        assert gen.generate(repetitive_prompt(seed), max_new_tokens=N_NEW).token_ids == expected[seed]


def test_an_int8_dyn_draft_head_is_trimmed_and_an_int8_wo_one_is_not(pair, expected):
    """int8-dyn computes from the weight rows as stored, so its head's first rows are a head
    of their own, computing what the whole head computes on them; int8-wo's packed head is
    used whole."""
    from copy import deepcopy

    from specgen.kernels import quantize

    target, draft = pair
    whole = quantize.apply(deepcopy(draft), "int8-wo", verifier=False)
    assert ModelDrafter(whole, 64, head_rows=40).lm.output is None  # every row: int8-wo
    quantized = quantize.apply(deepcopy(draft), "int8-dyn", verifier=False)
    drafter = ModelDrafter(quantized, 64, head_rows=40)
    assert drafter.lm.output is not None
    hidden = torch.randn(3, draft.config.hidden_size)
    assert torch.equal(drafter.lm.output(hidden), quantized.lm_head(hidden)[:, :40])
    context = repetitive_prompt(0)
    ids, _ = drafter.propose(context, 6, GREEDY, None)
    assert ids.max() < 40
    gen = SpeculativeGenerator(target, drafter, 4, adaptive=True)
    for seed in PROMPT_SEEDS:
        assert gen.generate(repetitive_prompt(seed), max_new_tokens=N_NEW).token_ids == expected[seed]


def test_the_draft_model_reads_the_prompt_only_when_first_asked_to_draft(pair):
    """The target's prompt pass gives the first token; the draft reads the prompt (and that
    token) in its first pass, then one or two tokens a pass. An answer that ends before
    adaptive K first drafts never runs the draft at all."""
    target, draft = pair
    drafter = ModelDrafter(draft, 64)
    prompt = repetitive_prompt(1)
    seen = []
    original = drafter._logits
    drafter._logits = lambda ids: (seen.append(ids.numel()), original(ids))[1]
    SpeculativeGenerator(target, drafter, 3, adaptive=False).generate(prompt, max_new_tokens=8)
    assert seen[0] == prompt.numel() + 1 and max(seen[1:]) <= 2
    seen.clear()
    result = SpeculativeGenerator(target, drafter, 3, adaptive=True).generate(prompt, max_new_tokens=2)
    assert result.stats.k_per_step == [0] and seen == []  # the prompt's pass, one plain step


def test_draft_confidence_ends_drafts_early_and_stays_exact(pair, expected):
    """A draft stops after its first token whose draft probability is below the threshold;
    what it proposes is a prefix of the uncut draft, and greedy output stays the target's."""
    target, draft = pair
    context = repetitive_prompt(0)
    full, _ = ModelDrafter(draft, 64).propose(context, 8, GREEDY, None)
    probs = []
    cut = ModelDrafter(draft, 64, confidence=0.6)
    original = cut._logits
    cut._logits = lambda ids: (lambda out: (probs.append(torch.softmax(out, -1).max().item()), out)[1])(original(ids))
    ids, _ = cut.propose(context, 8, GREEDY, None)
    assert ids.tolist() == full[: len(ids)].tolist()
    first_low = next((i for i, p in enumerate(probs) if p < 0.6), None)
    assert first_low is not None and first_low < 7, probs  # the fixture must exercise the stop
    assert len(ids) == first_low + 1 and cut.forward_passes == first_low + 1
    gen = SpeculativeGenerator(target, ModelDrafter(draft, 64, confidence=0.6), 8, adaptive=True)
    for seed in PROMPT_SEEDS:
        assert gen.generate(repetitive_prompt(seed), max_new_tokens=N_NEW).token_ids == expected[seed]


def test_a_draft_ends_once_its_probability_of_the_whole_draft_falls_below_stop_below(pair, expected, distribution):
    """Adaptive K's stop: the draft goes on while the product of its own token probabilities
    stays above `stop_below`; it keeps the token that took it below. The hybrid passes the
    model guesser drafts the same way; greedy output stays the target's."""
    target, draft = pair
    context = repetitive_prompt(0)
    probs = []
    full = ModelDrafter(draft, 64)
    original = full._logits
    full._logits = lambda ids: (lambda out: (probs.append(torch.softmax(out, -1).max().item()), out)[1])(original(ids))
    uncut, _ = full.propose(context, 8, GREEDY, None)
    sure = torch.tensor(probs).cumprod(0)
    assert sure[3] < sure[2], probs  # the fixture must exercise the stop
    threshold = float(sure[2] + sure[3]) / 2  # above the product of 4 tokens, below that of 3
    ids, _ = ModelDrafter(draft, 64).propose(context, 8, GREEDY, None, stop_below=threshold)
    assert ids.tolist() == uncut[:4].tolist()
    hybrid = HybridDrafter(ModelDrafter(draft, 64), PromptLookupDrafter())
    model_guess = hybrid.guessers(context)["model"]
    assert model_guess.propose(context, 8, GREEDY, None, threshold)[0].tolist() == uncut[:4].tolist()
    assert PromptLookupDrafter().propose(context, 8, GREEDY, None, stop_below=0.99)[0].numel() == 8
    for seed in PROMPT_SEEDS:  # exact whatever the stop
        gen = SpeculativeGenerator(target, distribution.StopAt(draft, 64, threshold), 8, adaptive=False)
        assert gen.generate(repetitive_prompt(seed), max_new_tokens=N_NEW).token_ids == expected[seed]


def test_the_engine_hands_the_planners_k_and_stop_to_the_draft(pair, monkeypatch):
    """A draft model ends its own drafts: the planner offers it k_max and a stop (FIRST_STOP
    while its pass is unmeasured), and what the plan says is what propose is asked for."""
    target, draft = pair
    drafter = ModelDrafter(draft, 64)
    planner = Planner(8)
    planner.verify_cost[0] = 0.1  # a plain step measured
    plan = planner.plan(drafter, repetitive_prompt(0), 100)
    assert (plan.guesser, plan.k, plan.stop_below) == ("model", 8, FIRST_STOP)
    monkeypatch.setattr(Planner, "plan", lambda self, who, tokens, limit, made=0: Plan(
        "model", who.guessers(tokens)["model"], min(8, limit), 0.25))
    asked = []
    propose = drafter.propose
    drafter.propose = lambda *a: (asked.append((a[1], a[4])), propose(*a))[1]
    SpeculativeGenerator(target, drafter, 8).generate(repetitive_prompt(0), max_new_tokens=12)
    assert asked[0] == (8, 0.25)


# --- a draft that reads only the context's last tokens (draft_window) ------------------------

def test_a_windowed_draft_reads_only_the_contexts_first_part_and_tail(tiny_model):
    """With more than `window` tokens unread, the draft starts over on the context's first
    `first` tokens (a quarter of the window by default) and its last window - first, as if
    the context were those joined; later it catches up one step at a time."""
    draft = tiny_model("llama", seed=1)
    context = repetitive_prompt(0)  # 28 tokens
    windowed = ModelDrafter(draft, 64, window=16)  # the first 4 and the last 12
    assert windowed.unread(context) == 16 and ModelDrafter(draft, 64).unread(context) == 28
    ids, _ = windowed.propose(context, 3, GREEDY, None)
    assert (windowed.skip_at, windowed.skipped) == (4, 12) and windowed.lm.length == 16 + 2
    assert windowed.catch_up[0] == 16  # what it read first, timed
    joined = torch.cat([context[:4], context[16:]])
    assert torch.equal(ids, ModelDrafter(draft, 64).propose(joined, 3, GREEDY, None)[0])
    longer = torch.cat([context, ids[:2], torch.tensor([5])])
    windowed.rollback(len(context) + 2)  # two drafts kept: the cache holds them
    assert windowed.lm.length == 16 + 2 and windowed.unread(longer) == 1
    windowed.rollback(10)  # a new prompt sharing 10 tokens: the tail is gone, the first part stays
    assert (windowed.skip_at, windowed.skipped, windowed.lm.length) == (0, 0, 4)
    tail = ModelDrafter(draft, 64, window=16, first=0)  # the last 16 alone
    ids, _ = tail.propose(context, 3, GREEDY, None)
    assert torch.equal(ids, ModelDrafter(draft, 64).propose(context[12:], 3, GREEDY, None)[0])
    with pytest.raises(ConfigError, match="window must be an integer >= 0"):
        ModelDrafter(draft, 64, window=-1)
    with pytest.raises(ConfigError, match="first part must be from 0"):
        ModelDrafter(draft, 64, window=16, first=16)


@pytest.mark.parametrize("method", ["draft-model", "hybrid"])
def test_a_windowed_draft_keeps_greedy_output_the_targets(pair, expected, method):
    target, draft = pair
    for k, adaptive in ((2, False), (5, False), (8, True)):
        gen = SpeculativeGenerator(target, make_drafter(method, draft, 64, window=16), k, adaptive)
        for seed in PROMPT_SEEDS:
            result = gen.generate(repetitive_prompt(seed), max_new_tokens=N_NEW)
            assert result.token_ids == expected[seed], (k, adaptive, seed)
    # A chat: the second prompt extends the first; the window starts over where it must.
    gen = SpeculativeGenerator(target, make_drafter(method, draft, 64, window=16), 4, False)
    first = repetitive_prompt(0)
    out = gen.generate(first, max_new_tokens=20).token_ids
    second = torch.cat([first, torch.tensor(out[:15]), repetitive_prompt(1)])
    reference = target.generate(second[None], do_sample=False, max_new_tokens=20)
    assert gen.generate(second, max_new_tokens=20).token_ids == reference[0, len(second):].tolist()


def test_a_windowed_draft_keeps_the_targets_distribution(distribution):
    target, draft = distribution.tiny_pair("llama")
    prompt = lookup_prompt(target)  # 10 tokens: the draft reads its last 4
    params = SamplingParams(1.0)
    joint = distribution.target_joint(target, prompt, 3, params)
    drafter = ModelDrafter(draft, distribution.VOCAB, window=4)
    gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=3, adaptive=False)
    kw = dict(max_new_tokens=3, temperature=params.temperature)
    samples = Counter(tuple(gen.generate(prompt, seed=i, **kw).token_ids) for i in range(distribution.SAMPLES))
    assert drafter.skipped > 0
    pvalue = distribution.chi_square_pvalue(samples, joint)
    assert pvalue > distribution.ALPHA, f"speculative samples differ from the target (p = {pvalue:.2e})"
