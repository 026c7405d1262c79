"""The speculative loop: greedy exactness, statistics, stopping, caches and bad input."""

import pytest
import torch

from specgen import SpecgenError, SpeculativeGenerator
from specgen.errors import ConfigError, ModelError
from specgen.choices import MAX_K

N = 40


def reference(target, ids, n=N):
    out = target.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, ids.shape[1]:].tolist()


def prompt(vocab=64, length=9, seed=0):
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def family_pair(request, tiny_pair):
    return tiny_pair(request.param)


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_equals_target_greedy(family_pair, k, adaptive):
    target, draft = family_pair
    for seed in range(3):
        ids = prompt(seed=seed)
        gen = SpeculativeGenerator(target, draft, num_speculative_tokens=k, adaptive=adaptive)
        assert gen.generate(ids, max_new_tokens=N).token_ids == reference(target, ids)


@pytest.mark.parametrize("scheme", ["int8-dyn", "int4-dyn"])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_equals_a_dynamic_int_target_greedy(k, scheme, tiny_pair):
    # int8-dyn and int4-dyn compute each row alike in a one-token pass and a verify pass, so
    # speculation reproduces the quantized target's own greedy output exactly, as in fp32.
    from copy import deepcopy

    from specgen.kernels import prepare, quantize

    target, draft = (prepare(deepcopy(m), role, scheme) for m, role in zip(tiny_pair("qwen2"), ("target", "draft")))
    assert any(m.kind == scheme for m in target.modules() if isinstance(m, quantize.QuantLinear))
    for seed in range(3):
        ids = prompt(seed=seed)
        result = SpeculativeGenerator(target, draft, k, adaptive=False).generate(ids, max_new_tokens=N)
        assert result.token_ids == reference(target, ids)
        assert result.stats.accepted > 0


@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_equals_a_bf16_target_greedy(k, tiny_pair):
    # On a CPU specgen's linear kernel computes each row alone and the target attends row by
    # row, so in bf16, too, speculation reproduces the target's own greedy output exactly.
    from copy import deepcopy

    from specgen.kernels import linear, prepare

    if linear.library() is None:
        pytest.skip("no C compiler or no AVX2 here")
    target, draft = (deepcopy(m).to(torch.bfloat16) for m in tiny_pair("qwen2"))
    prepare(target, "target")
    prepare(draft, "draft")
    for seed in range(4):
        ids = prompt(seed=seed, length=70)  # past the kernel's 64 rows a sweep
        result = SpeculativeGenerator(target, draft, k, adaptive=False).generate(ids, max_new_tokens=N)
        assert result.token_ids == reference(target, ids)
        assert result.stats.accepted > 0


def test_self_drafting_accepts_everything(tiny_pair):
    target, _ = tiny_pair("llama")
    ids = prompt()
    # The prompt's pass gives the first token, then each step 4 drafts and a bonus.
    result = SpeculativeGenerator(target, target, 4, adaptive=False, method="draft-model").generate(ids, max_new_tokens=N + 1)
    s = result.stats
    assert result.token_ids == reference(target, ids, N + 1)
    assert s.acceptance_rate == 1.0 and s.target_passes == 1 + N // 5
    assert s.tau == pytest.approx((N + 1) / (1 + N // 5))
    assert result.sources[:6] == ["bonus"] + ["accepted"] * 4 + ["bonus"]
    assert s.accepted_length_hist == [0, 0, 0, 0, N // 5]


def test_stats_are_consistent(tiny_pair):
    target, draft = tiny_pair("qwen2")
    result = SpeculativeGenerator(target, draft, 3, adaptive=False).generate(prompt(), max_new_tokens=N)
    s = result.stats
    assert s.new_tokens == len(result.token_ids) == N
    assert s.accepted == result.sources.count("accepted")
    assert s.target_passes == result.sources.count("resampled") + result.sources.count("bonus")
    assert sum(s.per_position_accepted) == s.accepted
    assert sum(s.per_position_proposed) == s.proposed
    assert sum(s.accepted_length_hist) == len([k for k in s.k_per_step if k])
    assert len(s.k_per_step) == s.target_passes - 1  # the prompt's pass is no step
    assert 0 < s.acceptance_rate < 1, "the fixture should exercise both outcomes"
    assert s.tau == pytest.approx(N / s.target_passes)
    steps, spent = s.target_passes - 1, s.draft_seconds + s.verify_seconds
    step = s.verify_seconds / steps  # the prompt's pass costs one plain step on both sides
    assert s.speedup_estimate == pytest.approx(N * step / (spent + step))
    assert s.speedup_estimate <= s.tau
    assert s.stop_reason == "max_new_tokens"
    assert s.prompt_tokens == 9 and s.prefill_tokens == 9
    d = s.to_dict()
    assert d["tau"] == s.tau and d["acceptance_rate"] == s.acceptance_rate
    assert d["draft_seconds"] > 0 and d["total_seconds"] >= d["draft_seconds"] + d["verify_seconds"]


def test_k_zero_is_plain_decoding(tiny_pair):
    target, draft = tiny_pair("llama")
    ids = prompt()
    result = SpeculativeGenerator(target, draft, 0).generate(ids, max_new_tokens=N)
    assert result.token_ids == reference(target, ids)
    assert set(result.sources) == {"bonus"} and result.stats.draft_passes == 0


def test_adaptive_switches_off_a_useless_draft(tiny_model, tiny_pair):
    target, _ = tiny_pair("llama")
    useless = tiny_model("llama", vocab=64, hidden=32, layers=1, seed=99)
    with torch.no_grad():  # a draft that always proposes token 0, which the target never picks
        useless.get_output_embeddings().weight.zero_()
        useless.get_output_embeddings().weight[0] = 1.0
        useless.model.norm.weight.fill_(1.0)
    ids = prompt()
    gen = SpeculativeGenerator(target, useless, 4, adaptive=True, method="draft-model")
    result = gen.generate(ids, max_new_tokens=60)
    assert result.token_ids == reference(target, ids, 60)
    assert result.stats.k_per_step.count(0) > len(result.stats.k_per_step) // 2


def test_eos_inside_draft_stops_and_drops_the_rest(tiny_pair):
    target, _ = tiny_pair("llama")
    ids = prompt()
    ref = reference(target, ids)
    eos = ref[7]
    first = ref.index(eos)
    result = SpeculativeGenerator(target, target, 8, adaptive=False).generate(
        ids, max_new_tokens=N, eos_token_ids=[eos, 999]
    )
    assert result.token_ids == ref[: first + 1]
    assert result.stats.stop_reason == "eos" and result.stats.new_tokens == first + 1


def test_eos_defaults_to_generation_config(tiny_model, sharpen):
    target = tiny_model("llama", vocab=64, hidden=64, layers=3, seed=0)
    sharpen(target, 4.0)
    ids = prompt()
    eos = reference(target, ids)[5]
    target.generation_config.eos_token_id = eos
    expected = target.generate(ids, do_sample=False, max_new_tokens=N)[0, 9:].tolist()
    result = SpeculativeGenerator(target, target, 3).generate(ids, max_new_tokens=N)
    assert result.token_ids == expected and result.token_ids[-1] == eos


class CharTokenizer:
    """Token i decodes to the letter chr(97 + i % 26)."""

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


def test_stop_string(tiny_pair):
    target, draft = tiny_pair("llama")
    ids = prompt()
    ref = reference(target, ids)
    text = CharTokenizer().decode(ref)
    stop = text[10:13]
    end = text.index(stop) + len(stop)
    result = SpeculativeGenerator(target, draft, 4).generate(
        ids, max_new_tokens=N, stop_strings=[stop], tokenizer=CharTokenizer()
    )
    assert result.token_ids == ref[:end] and result.stats.stop_reason == "stop_string"


def test_vocabularies_differing_in_padding_rows(tiny_model):
    target = tiny_model("qwen2", vocab=1000, hidden=64, layers=2, seed=0)
    draft = tiny_model("qwen2", vocab=1010, hidden=32, layers=1, seed=1)
    ids = prompt(vocab=1000)
    result = SpeculativeGenerator(target, draft, 4).generate(ids, max_new_tokens=N)
    assert result.token_ids == reference(target, ids)
    assert max(result.token_ids) < 1000
    sampled = SpeculativeGenerator(draft, target, 4).generate(ids, max_new_tokens=N, temperature=1.0, seed=0)
    assert len(sampled.token_ids) == N


def test_mismatched_vocabulary_is_refused(tiny_model):
    target = tiny_model("llama", vocab=64)
    with pytest.raises(ModelError, match="same tokenizer"):
        SpeculativeGenerator(target, tiny_model("llama", vocab=128))


def test_mismatched_eos_is_refused(tiny_model):
    with pytest.raises(ModelError, match="end-of-sequence"):
        SpeculativeGenerator(tiny_model("llama", eos=1), tiny_model("llama", eos=2))


def test_seeded_sampling_is_reproducible(tiny_pair):
    target, draft = tiny_pair("qwen2")
    gen = SpeculativeGenerator(target, draft, 3, adaptive=False)
    kw = dict(max_new_tokens=N, temperature=0.8, top_p=0.9, seed=1234)
    a, b = gen.generate(prompt(), **kw), gen.generate(prompt(), **kw)
    assert a.token_ids == b.token_ids and a.sources == b.sources
    c = gen.generate(prompt(), **{**kw, "seed": 4321})
    assert c.token_ids != a.token_ids


def test_stream_yields_tokens_with_sources(tiny_pair):
    target, draft = tiny_pair("llama")
    gen = SpeculativeGenerator(target, draft, 4)
    tokens = list(gen.stream(prompt()[0], max_new_tokens=12))  # a 1-D prompt works too
    assert len(tokens) == 12 and gen.stats.new_tokens == 12
    assert all(t.source in ("accepted", "resampled", "bonus") for t in tokens)


def test_prompt_prefix_is_reused_across_calls(tiny_pair):
    """A follow-up prompt that extends the last context prefills only its new tokens."""
    target, draft = tiny_pair("llama")
    gen = SpeculativeGenerator(target, draft, 4)
    ids = prompt()
    first = gen.generate(ids, max_new_tokens=10)
    follow = torch.cat([ids[0], torch.tensor(first.token_ids), torch.tensor([5, 6, 7])])
    second = gen.generate(follow, max_new_tokens=N)
    assert second.stats.prefill_tokens == 3 + 1  # the last answer token (pending), 5, 6, 7
    assert second.token_ids == reference(target, follow[None])
    other = prompt(seed=5)  # an unrelated prompt shares nothing and still decodes exactly
    assert gen.generate(other, max_new_tokens=N).token_ids == reference(target, other)


def test_ctrl_c_during_the_prompts_pass_resets_the_caches(tiny_pair):
    """An interrupt inside the prefill may leave the cache half-written: the next call
    must read its whole prompt again and still decode exactly."""
    target, draft = tiny_pair("llama")
    gen = SpeculativeGenerator(target, draft, 4)
    ids = prompt()
    first = gen.generate(ids, max_new_tokens=10)
    follow = torch.cat([ids[0], torch.tensor(first.token_ids), torch.tensor([5, 6, 7])])

    def interrupt(module, args):  # after the first layer has cached the new positions
        raise KeyboardInterrupt

    # A module every decoder calls (transformers' forward, and the lean one of a prepared target)
    hook = target.model.layers[1].input_layernorm.register_forward_pre_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        gen.generate(follow, max_new_tokens=N)
    hook.remove()
    assert gen.stats.stop_reason == "interrupted"
    again = gen.generate(follow, max_new_tokens=N)
    assert again.stats.prefill_tokens == len(follow)
    assert again.token_ids == reference(target, follow[None])


def test_single_token_prompt(tiny_pair):
    target, draft = tiny_pair("llama")
    ids = torch.tensor([[3]])
    assert SpeculativeGenerator(target, draft, 4).generate(ids, max_new_tokens=N).token_ids == reference(target, ids)


def test_context_limit_caps_new_tokens(tiny_pair):
    target, draft = tiny_pair("llama")
    ids = prompt(length=500)
    result = SpeculativeGenerator(target, draft, 4).generate(ids, max_new_tokens=100)
    assert len(result.token_ids) == 12  # max_position_embeddings is 512


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=1.0, top_p=0.0), "top-p"),
        (dict(temperature=1.0, top_p=1.5), "top-p"),
        (dict(top_k=-3), "top-k"),
        (dict(stop_strings=["x"]), "tokenizer"),
    ],
)
def test_bad_generation_arguments(kwargs, match, tiny_pair):
    target, draft = tiny_pair("llama")
    with pytest.raises(ConfigError, match=match):
        SpeculativeGenerator(target, draft).generate(prompt(), **kwargs)


def test_bad_inputs(tiny_pair):
    target, draft = tiny_pair("llama")
    for k in (-1, MAX_K + 1):
        with pytest.raises(ConfigError, match="from 0 to 32"):
            SpeculativeGenerator(target, draft, num_speculative_tokens=k)
    gen = SpeculativeGenerator(target, draft)
    with pytest.raises(ConfigError, match="empty"):
        gen.generate(torch.tensor([], dtype=torch.long))
    with pytest.raises(ConfigError, match="batch size 1"):
        gen.generate(torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ConfigError, match="shape"):
        gen.generate(torch.zeros(1, 1, 5, dtype=torch.long))
    assert issubclass(ConfigError, SpecgenError) and issubclass(ModelError, SpecgenError)


def test_the_generator_measures_reading_and_keeps_it_across_answers(tiny_pair):
    """The target's prompt pass and the draft's readings of the prompt are timed into the
    generator's book, which a new conversation keeps: they are the machine's costs. The
    draft's first reading, its warm-up in it, is not; a reading is kept as a share of the
    answer's plain step, which a fixed K never takes."""
    target, draft = tiny_pair()
    gen = SpeculativeGenerator(target, draft, 4, adaptive=False, method="draft-model")  # fixed K: the draft reads at once
    prompt = torch.arange(3, 63) % 60  # 60 tokens
    gen.generate(prompt, max_new_tokens=8)
    assert gen.book.prefill_cost is not None and gen.book.prefill_cost > 0
    assert "model" in gen.book.warm and "model" not in gen.book.read_share
    gen = SpeculativeGenerator(target, draft, 4, adaptive=True, method="draft-model")
    book = gen.book
    book.warm.add("model")  # as if it had read once: the next read is measured
    book.read_share["model"] = 1e-9  # priced as free: it reads the prompt at its first chance
    gen.generate(prompt, max_new_tokens=8)
    gen.reset()
    gen.generate(prompt, max_new_tokens=8)
    assert gen.book is book and book.read_share["model"] > 1e-9  # measured, and kept

def test_the_planner_hears_how_sure_the_target_was_at_each_step(tiny_pair, monkeypatch):
    """The target's top probability at each step's first position reaches the planner with
    the step's one transfer: the prompt's pass first, then one per step."""
    from specgen.core.adaptive import Planner

    target, draft = tiny_pair()
    heard = []
    monkeypatch.setattr(Planner, "sure", lambda self, p: heard.append(p))
    ids = prompt()
    result = SpeculativeGenerator(target, draft, 3).generate(ids, max_new_tokens=12)
    assert len(heard) == result.stats.target_passes
    with torch.no_grad():
        first = target(ids).logits[0, -1].float().softmax(-1).max().item()
    assert heard[0] == pytest.approx(first, abs=1e-5)
    assert all(0.0 < p <= 1.0 for p in heard)


def test_plain_decoding_asks_no_guesser_and_reads_no_top_probability(tiny_pair, monkeypatch):
    """K = 0 (the bench's plain contestant) or fixed K: the planner estimates nothing, so a
    step computes no softmax over the vocabulary for it, and plain decoding asks no guesser
    (prompt lookup would search the text every step)."""
    from specgen.core import drafters, engine

    target, draft = tiny_pair()
    ids = prompt()
    monkeypatch.setattr(engine, "top_probability", lambda logits: pytest.fail("softmax computed"))
    asked = []
    real = drafters.PromptLookupDrafter.guessers
    monkeypatch.setattr(drafters.PromptLookupDrafter, "guessers",
                        lambda self, tokens: asked.append(1) or real(self, tokens))
    plain = SpeculativeGenerator(target, draft, 0, method="prompt-lookup").generate(ids, max_new_tokens=N)
    assert plain.token_ids == reference(target, ids) and not asked
    fixed = SpeculativeGenerator(target, draft, 3, adaptive=False).generate(ids, max_new_tokens=N)
    assert fixed.token_ids == plain.token_ids
