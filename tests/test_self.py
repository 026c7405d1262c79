"""Self-speculative drafting (method "self"): the target drafts for itself with sub-layers
skipped, over its own KV cache. Greedy output must be the target's own, sampled output must
have the target's distribution, the draft's cache entries must never reach the verify pass,
and bad input is one clear error. Also: skip sets in profiles and in the tuned cache, the
`self` bench contestants, `specgen tune` and hybrid drafting with lookup, then self."""

from __future__ import annotations

import json
from copy import deepcopy

import pytest
import torch
from typer.testing import CliRunner

from specgen.cli import app
from specgen.core.drafters import (HybridDrafter, SelfDrafter, check_skip, default_skip,
                                   make_drafter)
from specgen.core.engine import SpeculativeGenerator
from specgen.core.sampling import SamplingParams
from specgen.decoding import HFDecoder, LeanDecoder, make_decoder
from specgen.decoding.lean import Skip
from specgen.errors import ConfigError
from specgen.kernels import linear, prepare

N = 40
needs_linear = pytest.mark.skipif(linear.library() is None, reason="no C compiler or no AVX2 here")


def prompt(length=9, seed=0):
    return torch.randint(0, 64, (1, length), generator=torch.Generator().manual_seed(seed))


def reference(target, ids, n=N):
    out = target.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, ids.shape[1]:].tolist()


def exact_target(tiny_pair, family: str, scheme: str = "float32"):
    """The tiny pair's target, prepared as specgen loads a target: it verifies row by row,
    so the lean decoder (which the self drafter drafts through) serves it."""
    target = deepcopy(tiny_pair(family)[0])
    if scheme == "bfloat16":
        target = target.to(torch.bfloat16)
    prepare(target, "target", scheme if scheme.endswith("-dyn") else "none")
    assert isinstance(make_decoder(target, exact=True), LeanDecoder)
    return target


MLP_1 = Skip(frozenset(), frozenset({1}))  # the tiny target has 3 layers


# --- exactness --------------------------------------------------------------------------------

@needs_linear
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_equals_target_greedy_for_every_k(family, tiny_pair):
    target = exact_target(tiny_pair, family)
    proposed = accepted = 0
    for k in range(1, 9):
        for adaptive in (False, True):
            gen = SpeculativeGenerator(target, SelfDrafter(MLP_1), k, adaptive)
            for seed in range(2):
                ids = prompt(seed=seed)
                result = gen.generate(ids, max_new_tokens=N)
                assert result.token_ids == reference(target, ids), (k, adaptive, seed)
                proposed += result.stats.proposed
                accepted += result.stats.accepted
    assert accepted > 0 and proposed > accepted  # drafts were both kept and rejected


@pytest.mark.parametrize("scheme", ["int8-dyn", "int4-dyn", "bfloat16"])
def test_greedy_equals_target_greedy_in_every_cpu_scheme(scheme, tiny_pair):
    if scheme in ("int4-dyn", "bfloat16") and linear.library() is None:
        pytest.skip("no C compiler or no AVX2 here")
    target = exact_target(tiny_pair, "qwen2", scheme)
    for k, adaptive in ((1, False), (4, False), (8, True)):
        gen = SpeculativeGenerator(target, SelfDrafter(default_skip(3)), k, adaptive)
        ids = prompt(seed=k)
        result = gen.generate(ids, max_new_tokens=N)
        assert result.token_ids == reference(target, ids), (scheme, k)
        assert result.stats.draft_passes > 0


@needs_linear
def test_skipping_attention_and_whole_layers_stays_exact(tiny_pair):
    target = exact_target(tiny_pair, "llama")
    for skip in (Skip(frozenset({1}), frozenset()), Skip(frozenset({0, 2}), frozenset({2})),
                 Skip(frozenset({1}), frozenset({1}))):
        gen = SpeculativeGenerator(target, SelfDrafter(skip), 4, adaptive=True)
        ids = prompt(seed=5)
        assert gen.generate(ids, max_new_tokens=N).token_ids == reference(target, ids), skip


@needs_linear
@pytest.mark.parametrize("family, k, n, params", [
    ("llama", 3, 3, SamplingParams(1.0)),
    ("qwen2", 2, 4, SamplingParams(0.8, top_k=4)),
])
def test_sampled_output_has_the_target_distribution(family, k, n, params, distribution):
    target = deepcopy(distribution.tiny_pair(family)[0])
    prepare(target, "target")
    joint = distribution.target_joint(target, distribution.PROMPT, n, params)
    gen = SpeculativeGenerator(target, SelfDrafter(Skip(frozenset({1}), frozenset({1}))), k,
                               adaptive=False)
    samples, sources = distribution.draw(gen, n, params)
    # The skipped target both agrees and disagrees with the full one.
    assert min(sources["accepted"], sources["resampled"], sources["bonus"]) > distribution.SAMPLES // 50
    pvalue = distribution.chi_square_pvalue(samples, joint)
    assert pvalue > distribution.ALPHA, f"self-speculative samples differ from the target (p = {pvalue:.2e})"


# --- the shared cache -------------------------------------------------------------------------

def plain_cache(target, tokens: torch.Tensor) -> torch.Tensor:
    """The target's KV cache after reading `tokens` one at a time, as plain decoding does."""
    decoder = make_decoder(target, exact=True)
    with torch.inference_mode():
        for t in tokens:
            decoder.logits(t[None], 1)
    return decoder.kv[..., : decoder.length, :]


class Poisoning(SelfDrafter):
    """After each draft, overwrites every cache slot past the context with NaN: the slots the
    draft's passes wrote, of the layers they ran. What the verify pass reads of them must be
    what it wrote itself."""

    def propose(self, tokens, k, params, generator, stop_below=0.0):
        out = super().propose(tokens, k, params, generator, stop_below)
        decoder = self.lm.decoder
        decoder.kv[..., decoder.length:, :] = float("nan")
        return out


class Leaking(SelfDrafter):
    """A broken drafter that keeps its draft's entry for the pending token, as if the
    verify pass could start after it (it cannot: that entry came from a skipped pass)."""

    def propose(self, tokens, k, params, generator, stop_below=0.0):
        start = self.lm.length
        out = super().propose(tokens, k, params, generator, stop_below)
        if len(out[0]):
            self.lm.decoder.length = start + 1
            self.lm.decoder.crop = lambda length, d=self.lm.decoder: setattr(d, "length", length)
        return out


@needs_linear
@pytest.mark.parametrize("skip", [MLP_1, Skip(frozenset({1}), frozenset({0}))])
def test_the_drafts_cache_entries_never_reach_the_verify_pass(skip, tiny_pair):
    """After generating, the target's cache holds exactly the entries plain decoding of the
    same tokens gives, bit for bit; and drafts whose entries are poisoned with NaN once the
    draft ends still give the target's own greedy output."""
    target = exact_target(tiny_pair, "qwen2")
    ids = prompt(seed=3)
    gen = SpeculativeGenerator(target, SelfDrafter(skip), 4, adaptive=False)
    result = gen.generate(ids, max_new_tokens=N)
    assert result.stats.draft_passes > 0 and result.stats.accepted > 0
    context = torch.cat([ids[0], torch.tensor(result.token_ids)])[:-1]
    cached = gen._decoder.kv[..., : gen._decoder.length, :]
    assert gen._decoder.length == len(context)
    assert torch.equal(cached, plain_cache(target, context))

    poisoned = SpeculativeGenerator(target, Poisoning(skip), 4, adaptive=False)
    assert poisoned.generate(ids, max_new_tokens=N).token_ids == reference(target, ids)
    assert not poisoned._decoder.kv[..., : poisoned._decoder.length, :].isnan().any()


@needs_linear
def test_a_leaking_drafter_is_caught(tiny_pair):
    """The negative control of the test above: entries of a skipped pass left in the cache
    change the output."""
    target = exact_target(tiny_pair, "qwen2")
    ids = prompt(seed=3)
    gen = SpeculativeGenerator(target, Leaking(MLP_1), 4, adaptive=False)
    assert gen.generate(ids, max_new_tokens=N).token_ids != reference(target, ids)


@needs_linear
def test_the_drafter_holds_no_weights_or_cache_of_its_own(tiny_pair):
    target = exact_target(tiny_pair, "llama")
    drafter = SelfDrafter(MLP_1)
    gen = SpeculativeGenerator(target, drafter, 4)
    assert drafter.lm.decoder is gen._decoder
    assert drafter.lm.output is None  # the target's own output layer, through its decoder
    before = gen._decoder.length
    ids, _ = drafter.propose(torch.tensor([1, 2, 3]), 3, SamplingParams(), None)
    assert gen._decoder.length == before and drafter.forward_passes == 3


@pytest.mark.parametrize("scheme", ["float32", "int4-dyn"])
def test_a_self_draft_over_the_first_rows_of_the_head_stays_exact(scheme, tiny_pair):
    """draft_vocab applies to the self drafter too: its output layer is the target's first
    rows (a view of a float head, or of an int4-dyn head's packed rows), so drafting reads
    less; only acceptance can change."""
    if linear.library() is None:
        pytest.skip("no C compiler or no AVX2 here")
    target = exact_target(tiny_pair, "qwen2", scheme)
    proposed = []

    class Recording(SelfDrafter):
        def propose(self, *args, **kwargs):
            out = super().propose(*args, **kwargs)
            proposed.extend(out[0].tolist())
            return out

    drafter = Recording(MLP_1, head_rows=40)
    gen = SpeculativeGenerator(target, drafter, 4, adaptive=True)
    hidden = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    full = target.get_output_embeddings()(hidden)
    if scheme == "int4-dyn":  # each row of the kernel's output is computed alone
        assert torch.equal(drafter.lm.output(hidden), full[:, :40])
        assert drafter.lm.output.layer.weight.data_ptr() == target.lm_head.weight.data_ptr()
    else:
        torch.testing.assert_close(drafter.lm.output(hidden), full[:, :40])
        assert drafter.lm.output.weight.data_ptr() == target.lm_head.weight.data_ptr()
    for seed in range(2):
        ids = prompt(seed=seed)
        result = gen.generate(ids, max_new_tokens=N)
        assert result.token_ids == reference(target, ids)
        assert result.stats.draft_passes > 0
    assert proposed and max(proposed) < 40


@needs_linear
def test_a_conversation_reusing_the_cache_stays_exact(tiny_pair):
    """A second prompt extending the first reuses the target's cache, which the self drafter
    shares: only the new tokens are read, and the output is still the target's."""
    target = exact_target(tiny_pair, "llama")
    gen = SpeculativeGenerator(target, SelfDrafter(MLP_1), 3, adaptive=True)
    first = prompt(seed=1)[0]
    out = gen.generate(first, max_new_tokens=20).token_ids
    second = torch.cat([first, torch.tensor(out[:15]), prompt(seed=2)[0][:6]])
    result = gen.generate(second, max_new_tokens=20)
    assert result.token_ids == reference(target, second[None], 20)
    assert result.stats.prefill_tokens < len(second) - 1 and result.stats.draft_passes > 0


# --- hybrid: lookup first, then self ----------------------------------------------------------

@needs_linear
def test_hybrid_without_a_draft_model_is_lookup_then_self_and_exact(tiny_pair):
    target = exact_target(tiny_pair, "llama")
    drafter = make_drafter("hybrid", None, 64, skip=MLP_1)
    assert isinstance(drafter, HybridDrafter) and isinstance(drafter.model_drafter, SelfDrafter)
    gen = SpeculativeGenerator(target, drafter, 4, adaptive=True)
    phrase = torch.randint(64, (10,), generator=torch.Generator().manual_seed(1))
    ids = torch.cat([phrase, phrase, phrase[:3]])[None]
    result = gen.generate(ids, max_new_tokens=N)
    assert result.token_ids == reference(target, ids)
    assert drafter.lookup_drafter.matches > 0
    assert tuple(drafter.guessers(ids[0])) == ("lookup-3", "self")


# --- bad input --------------------------------------------------------------------------------

def test_an_unsupported_architecture_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
    with pytest.raises(ConfigError, match="supports Llama-family targets.*'gpt2'"):
        SpeculativeGenerator(gpt2, SelfDrafter(), 4)


def test_a_target_on_transformers_forward_is_refused(tiny_model):
    target = tiny_model("qwen2")  # not prepared: no row attention, so no lean decoder
    assert isinstance(make_decoder(target, exact=True), HFDecoder)
    with pytest.raises(ConfigError, match="lean decoder"):
        SpeculativeGenerator(target, SelfDrafter(), 4, prepare=False)


@pytest.mark.parametrize("skip, message", [
    (Skip(frozenset(), frozenset({3})), "MLP of layer 3, but the target has 3 layers"),
    (Skip(frozenset({7}), frozenset()), "attention of layer 7"),
    (Skip(frozenset(range(3)), frozenset(range(3))), "skips every layer"),
    (Skip(), "skips nothing"),
])
def test_bad_skip_sets_are_refused(skip, message):
    with pytest.raises(ConfigError, match=message):
        check_skip(skip, 3)


def test_the_default_skips_every_other_mlp_in_the_middle_half():
    assert default_skip(28) == Skip(frozenset(), frozenset({7, 9, 11, 13, 15, 17, 19}))
    for layers in (1, 2, 3, 4, 32):
        check_skip(default_skip(layers), layers)


def test_an_unbound_drafter_says_what_to_do():
    with pytest.raises(ConfigError, match="SpeculativeGenerator"):
        SelfDrafter().propose(torch.tensor([1, 2]), 2, SamplingParams(), None)


# --- profiles, the tuned cache and the CLI ----------------------------------------------------

@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "history.sqlite3"))
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))


def self_profile(tiny_profile, tmp_path, extra: str = "", name: str = "selfy"):
    """The tiny pair's profile, drafting with method "self" (and `extra` speculation keys)."""
    path = tmp_path / f"{name}.toml"
    path.write_text(f'extends = "{tiny_profile}"\n[speculation]\nmethod = "self"\n{extra}')
    return path


def cli(*args, input=None):
    return CliRunner().invoke(app, list(args), input=input)


@pytest.mark.parametrize("text, message", [
    ('skip_layers = "m1,x2"', "'x2' is not a sub-layer"),
    ('skip_layers = "m3-1"', "empty range"),
    ('skip_layers = ""', "names no sub-layer"),
    ('skip_layers = 4', "must be a string"),
])
def test_profile_skip_layers_are_validated(tmp_path, text, message):
    from specgen.profiles import load_profile

    path = tmp_path / "p.toml"
    path.write_text(f'[target]\nmodel = "x"\n[speculation]\nmethod = "self"\n{text}\n')
    with pytest.raises(ConfigError, match=message):
        load_profile(str(path))


def test_a_profile_without_a_draft_may_use_self_and_hybrid(tmp_path):
    from specgen.profiles import load_profile

    for method in ("self", "hybrid"):
        path = tmp_path / f"{method}.toml"
        path.write_text(f'[target]\nmodel = "x"\n[speculation]\nmethod = "{method}"\n'
                        f'skip_layers = "m2, a4-5, 7"\n')
        assert load_profile(str(path)).speculation.skip_layers == "m2, a4-5, 7"
    path.write_text('[target]\nmodel = "x"\n[speculation]\nmethod = "draft-model"\n')
    with pytest.raises(ConfigError, match="needs a \\[draft\\] model"):
        load_profile(str(path))


@needs_linear
@pytest.mark.parametrize("extra, message", [
    ('skip_layers = "m5"', "MLP of layer 5, but the target has 3 layers"),
    ('skip_layers = "0-2"', "skips every layer"),
])
def test_bad_skip_sets_in_a_profile_are_one_clear_error(tiny_profile, tmp_path, extra, message):
    result = cli("run", "-p", str(self_profile(tiny_profile, tmp_path, extra)), "hi")
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert result.stderr.strip().startswith("error:") and len(result.stderr.strip().splitlines()) <= 3


def test_an_unsupported_architecture_in_a_profile_is_one_clear_error(tmp_path, tiny_tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=259, n_embd=32, n_layer=2, n_head=4,
                                       eos_token_id=258, bos_token_id=None))
    model.save_pretrained(tmp_path / "gpt2")
    tiny_tokenizer().save_pretrained(tmp_path / "gpt2")
    profile = tmp_path / "g.toml"
    profile.write_text(f'[target]\nmodel = "{tmp_path / "gpt2"}"\ndtype = "float32"\n'
                       f'device = "cpu"\n[speculation]\nmethod = "self"\n')
    result = cli("run", "-p", str(profile), "hi")
    assert result.exit_code == 2, result.output
    assert "supports Llama-family targets" in result.stderr and "Traceback" not in result.output


@needs_linear
def test_run_with_self_is_the_targets_greedy_output_and_says_the_default_once(tiny_profile, tmp_path,
                                                                             chat_greedy):
    profile = self_profile(tiny_profile, tmp_path)
    first = cli("run", "-p", str(profile), "--format", "json", "-n", "30", "def quicksort(xs):")
    assert first.exit_code == 0, first.output
    assert "default skip set (m0,m2" in first.stderr and "specgen tune" in first.stderr
    answer = json.loads(first.stdout)
    assert answer["draft"] is None and answer["stats"]["draft_passes"] > 0
    expected = chat_greedy(tiny_profile.parent / "target", "def quicksort(xs):", 30)
    assert [t["id"] for t in answer["tokens"]] == expected
    again = cli("run", "-p", str(profile), "--format", "json", "-n", "4", "hi")
    assert again.exit_code == 0 and "default skip set" not in again.stderr


@needs_linear
def test_a_skip_set_comes_from_the_profile_then_the_tuned_cache_then_the_default(tiny_profile, tmp_path):
    from specgen.app import skipsets
    from specgen.profiles import load_profile
    from specgen.app.session import open_session

    session = open_session(load_profile(str(self_profile(tiny_profile, tmp_path))))
    assert session.skip.origin == "default" and session.skip.skip == default_skip(3)
    assert session.notices and "default skip set" in session.notices[0]
    path = skipsets.save_tuned(session.pair, Skip(frozenset({2}), frozenset({1})), speedup=1.5)
    assert json.loads(path.read_text())["skip_layers"] == "m1,a2"
    session = open_session(load_profile(str(self_profile(tiny_profile, tmp_path))))
    assert session.skip.origin == "tuned" and session.skip.skip == Skip(frozenset({2}), frozenset({1}))
    assert session.generator.drafter.lm.skip == session.skip.skip and not session.notices
    pinned = self_profile(tiny_profile, tmp_path, 'skip_layers = "a1"', name="pinned")
    session = open_session(load_profile(str(pinned)))
    assert session.skip.origin == "profile" and session.skip.skip == Skip(frozenset({1}), frozenset())
    # Another quantization of the same weights is another target to tune.
    from specgen.profiles import with_overrides

    quantized = open_session(with_overrides(load_profile(str(self_profile(tiny_profile, tmp_path))),
                                            target_quantization="int8-dyn"))
    assert skipsets.target_key(quantized.pair) != skipsets.target_key(session.pair)
    assert quantized.skip.origin == "default"


@needs_linear
def test_bench_measures_self_beside_the_others_and_it_is_exact(tiny_profile, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"category": "code-completion", "prompt": "def add(a, b):"}\n'
                       '{"category": "grounded", "prompt": "abc abc abc abc"}\n')
    out = tmp_path / "b.json"
    result = cli("bench", "-p", str(tiny_profile), "--prompts", str(prompts), "-n", "10",
                 "--contestants", "baseline,plain,adaptive,self,self-default,hybrid-self",
                 "--out", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["config"]["skip_origin"] == "default"
    assert doc["config"]["skip_layers"] == doc["config"]["default_skip_layers"] == "m0,m2"
    for name in ("self", "self-default", "hybrid-self"):
        assert doc["summary"][name]["equal_to_baseline"] == "2/2"
        assert doc["summary"][name]["vs_plain"] > 0
    methods = {m["contestant"]: m["method"] for m in doc["measurements"] if "method" in m}
    assert not methods or {methods[n] for n in ("self", "hybrid-self")} == {"self", "hybrid"}


# --- tune -------------------------------------------------------------------------------------

def fake_measure(best: set, trials: list):
    """A measurable landscape: the rate peaks at `best` and falls with each sub-layer away."""
    from specgen.tune.search import Score

    def measure(skip):
        trials.append(skip)
        return Score(10.0 - len(skip ^ best))
    return measure


def test_the_search_climbs_to_the_best_set_it_can_reach():
    from specgen.tune.search import Search, rank

    layers = 6
    subs = [(kind, i) for i in range(layers) for kind in ("attention", "mlp")]
    importance = {s: (0.1 if s[0] == "mlp" else 0.3) * (1 + abs(s[1] - 3)) for s in subs}
    cost = {s: 8.0 if s[0] == "mlp" else 1.0 for s in subs}
    order = rank(importance, cost)
    assert order[0] == ("mlp", 3) and order[-1][0] == "attention"
    best = {("mlp", 2), ("mlp", 3), ("mlp", 4), ("attention", 3)}
    trials: list = []
    search = Search(order, cost, fake_measure(best, trials), lambda: 1e9,
                    default=frozenset({("mlp", 1)}), layers=layers)
    found = search.run()
    assert found.skip == frozenset(best) and found.rate == 10.0
    assert trials[0] == frozenset({("mlp", 1)})  # the default is measured first
    assert all(0 < len(t) < 2 * layers for t in trials)


def test_one_slow_measurement_does_not_lose_the_best_set():
    """Noise only slows a measurement down: the best set measured at a slow moment is
    measured again, and its best measurement counts."""
    from specgen.tune.search import Score, Search

    order = [("mlp", i) for i in range(4)]
    best = frozenset(order[:2])
    seen = []

    def measure(skip):
        seen.append(skip)
        slow = skip == best and seen.count(best) == 1
        return Score((10.0 - len(skip ^ best)) * (0.3 if slow else 1.0))

    search = Search(order, {s: 1.0 for s in order}, measure, lambda: 1e9, layers=4)
    assert search.run().skip == best and seen.count(best) >= 2


def test_the_search_stops_when_the_time_is_spent():
    from specgen.tune.search import Search

    order = [("mlp", i) for i in range(4)]
    clock = iter(range(100, 0, -1))
    trials: list = []
    search = Search(order, {s: 1.0 for s in order}, fake_measure(set(order[:2]), trials),
                    lambda: next(clock) - 97.5, layers=4)
    search.last_seconds = 1.0
    search.run()
    assert 1 <= len(search.trials) <= 3


@needs_linear
def test_tune_stores_a_set_that_run_then_uses(tiny_profile, tmp_path, monkeypatch):
    import time

    from specgen.tune import search

    profile = self_profile(tiny_profile, tmp_path)
    monkeypatch.setattr(search, "LADDER", (0.2, 0.4))
    start = time.perf_counter()
    result = cli("tune", "-p", str(profile), "--minutes", "0.3", "-n", "12")
    assert result.exit_code == 0, result.output
    assert time.perf_counter() - start < 60
    assert "skip set:" in result.stderr and "x plain decoding" in result.stderr
    assert "warning" not in result.stderr  # every candidate's output was plain decoding's
    (stored,) = (tmp_path / "cache" / "tuned").glob("*.json")
    doc = json.loads(stored.read_text())
    assert doc["trials"] >= 2 and doc["plain_tokens_per_second"] > 0 and doc["layers"] == 3
    run = cli("run", "-p", str(profile), "--format", "json", "-n", "6", "hi")
    assert run.exit_code == 0 and "default skip set" not in run.stderr


@pytest.mark.parametrize("args, message", [
    (["--minutes", "0"], "--minutes must be more than 0"),
    (["--max-new-tokens", "2"], "--max-new-tokens must be at least 8"),
    (["--prompts", "/no/such.jsonl"], "Cannot read the prompts file"),
])
def test_bad_tune_options_are_one_clear_error(tiny_profile, args, message):
    result = cli("tune", "-p", str(tiny_profile), *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output

