"""A draft model run by llama.cpp (LlamaCppDraft): exactness with it, its cache marks, the
pair checks, and loading it from a profile. llama-cpp-python is optional and absent in CI:
FakeLlama stands in for its Llama over a tiny transformers model, so the draft's tokens and
q are the same as the transformers draft's, and the tests compare the two step for step. One
test runs the real llama.cpp on a tiny GGUF file where llama-cpp-python is installed."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from specgen.decoding import llamacpp
from specgen.bench.runner import Bench, contestants
from specgen.cli import app
from specgen.core.drafters import ModelDrafter, make_drafter
from specgen.core.drafters import check_pair
from specgen.core.engine import SpeculativeGenerator
from specgen.errors import ConfigError, ModelError
from specgen.decoding.llamacpp import LlamaCppDraft
from specgen.core.sampling import SamplingParams


@pytest.fixture(autouse=True)
def fake_module(fake_llama):
    """Every test here imports llama_cpp as the stand-in that FakeLlama goes with."""


def llama_draft(fake_llama, model) -> LlamaCppDraft:
    return LlamaCppDraft(fake_llama(model))


def prompt(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_output_and_every_step_equal_the_transformers_drafts(adaptive, tiny_pair, fake_llama):
    target, draft = tiny_pair()
    for seed in range(3):
        ids = prompt(seed)
        plain = target.generate(ids, do_sample=False, max_new_tokens=40, min_new_tokens=40)
        via_torch = SpeculativeGenerator(target, ModelDrafter(draft, 64), 6, adaptive=adaptive)
        via_llama = SpeculativeGenerator(target, ModelDrafter(llama_draft(fake_llama, draft), 64), 6, adaptive=adaptive)
        a = via_torch.generate(ids, max_new_tokens=40)
        b = via_llama.generate(ids, max_new_tokens=40)
        assert b.token_ids == a.token_ids == plain[0, 9:].tolist()
        assert 0 < b.stats.accepted <= b.stats.proposed
        if not adaptive:  # (adaptive K decides on measured times, which differ run to run:
            # with tiny models a dear draft may rightly stop after a trial it passed whole)
            assert b.stats.accepted < b.stats.proposed  # a rejection, rolled back
            # Same drafts, same rejections: the marks and catch-up reads match the torch cache.
            assert b.stats.k_per_step == a.stats.k_per_step
            assert b.stats.draft_passes == a.stats.draft_passes


def test_rejected_drafts_are_dropped_and_only_missing_tokens_are_read(tiny_pair, fake_llama):
    target, draft = tiny_pair()
    lm = llama_draft(fake_llama, draft)
    drafter = ModelDrafter(lm, 64)
    context = prompt()[0]
    ids, _ = drafter.propose(context, 4, SamplingParams(), None)
    assert lm.llm.evals == [9, 1, 1, 1]  # the prompt in one read, then one token a pass
    assert lm.length == 9 + 3  # the last draft is not read yet
    drafter.rollback(10)  # the target kept d1 only
    assert lm.length == 10
    kept = torch.cat([context, ids[:1], torch.tensor([5])])
    drafter.propose(kept, 1, SamplingParams(), None)
    assert lm.llm.evals[-1] == 1 and lm.length == 11  # only the target's token was missing
    # The rejected entries were dropped before that read: the same logits as a fresh draft's.
    fresh = ModelDrafter(llama_draft(fake_llama, draft), 64)
    fresh.propose(kept, 1, SamplingParams(), None)
    assert np.allclose(fresh.lm.llm.buffer, lm.llm.buffer, atol=1e-5)


def test_a_context_that_outgrows_the_drafts_room_moves_to_a_bigger_one(tiny_pair, fake_llama):
    """A draft starts with room for a few tokens (llama.cpp clears a whole cache when it makes
    one) and, when a context outgrows it, reloads with twice the room and reads again the
    tokens it held: the same drafts as a draft with room for all, the target's output."""
    target, draft = tiny_pair()
    rooms = []

    def reload(n_ctx: int):
        rooms.append(n_ctx)
        return fake_llama(draft, n_ctx=n_ctx)

    ids = prompt(3)
    roomy = SpeculativeGenerator(target, ModelDrafter(llama_draft(fake_llama, draft), 64), 6,
                                 adaptive=False)
    lm = LlamaCppDraft(reload(8), reload)
    growing = SpeculativeGenerator(target, ModelDrafter(lm, 64), 6, adaptive=False)
    a = roomy.generate(ids, max_new_tokens=40)
    b = growing.generate(ids, max_new_tokens=40)
    plain = target.generate(ids, do_sample=False, max_new_tokens=40, min_new_tokens=40)
    assert b.token_ids == a.token_ids == plain[0, 9:].tolist()
    assert b.stats.k_per_step == a.stats.k_per_step and b.stats.accepted == a.stats.accepted
    assert rooms == [8, 16, 32, 64]  # a 9-token prompt, then about 40 more
    assert lm.llm.evals[0] > 1  # the new model read the context held so far in one pass
    assert lm.limit() == draft.config.max_position_embeddings  # as far as it can grow


def test_sampled_output_keeps_the_target_distribution(distribution, fake_llama):
    target, draft = distribution.tiny_pair("llama")
    params = SamplingParams(1.0)
    joint = distribution.target_joint(target, distribution.PROMPT, 4, params)
    drafter = ModelDrafter(llama_draft(fake_llama, draft), distribution.VOCAB)
    gen = SpeculativeGenerator(target, drafter, 3, adaptive=False)
    samples, sources = distribution.draw(gen, 4, params)
    assert sources["accepted"] > distribution.SAMPLES // 50 and sources["resampled"] > distribution.SAMPLES // 50
    pvalue = distribution.chi_square_pvalue(samples, joint)
    assert pvalue > distribution.ALPHA, f"speculative samples differ from the target (p = {pvalue:.2e})"


def test_a_draft_of_another_tokenizer_is_refused(tiny_model, tiny_pair, fake_llama):
    target, _ = tiny_pair()
    small = tiny_model(vocab=32, seed=3)
    with pytest.raises(ModelError, match="does not match the target's"):
        check_pair(target, llama_draft(fake_llama, small))
    other_eos = LlamaCppDraft(fake_llama(tiny_pair()[1], eos=7))
    eos_target = tiny_model(vocab=64, seed=4, eos=3)
    with pytest.raises(ModelError, match="end-of-sequence token"):
        check_pair(eos_target, other_eos)
    SpeculativeGenerator(target, llama_draft(fake_llama, tiny_pair()[1]), 4)  # a matching one is taken as is


def test_the_bench_gives_specgen_the_llama_draft_and_the_peer_its_transformers_copy(tiny_pair, fake_llama):
    target, draft = tiny_pair()
    lm = llama_draft(fake_llama, draft)
    everyone = contestants("draft-model", 4)
    runner = Bench(target, lm, 12, eos_ids=[], peer_draft=draft)
    tokens, _ = runner.measure(everyone["adaptive"], prompt()[0])
    assert lm.llm.evals  # specgen drafted in "llama.cpp"
    peer_tokens, stats = runner.measure(everyone["peer"], prompt()[0])
    assert peer_tokens == tokens and stats.draft_passes > 0
    alone = Bench(target, lm, 12, eos_ids=[])
    with pytest.raises(ConfigError, match="needs a transformers draft model"):
        alone.measure(everyone["peer"], prompt()[0])
    assert isinstance(make_drafter("hybrid", lm, 64).model_drafter.lm, LlamaCppDraft)


def test_chat_answers_with_a_llama_cpp_draft_within_its_context(tmp_path, monkeypatch, fake_llama, tiny_profile):
    from specgen.commands.chat import Chat
    from specgen.profiles import load_profile
    from specgen.app.session import open_session

    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "history.sqlite3"))
    session = open_session(load_profile(str(tiny_profile)))
    target = session.pair.target
    session.pair.draft = lm = LlamaCppDraft(fake_llama(session.pair.draft, eos=258, n_ctx=300))
    session.generator = SpeculativeGenerator(target, lm, 4)
    chat = Chat(session)
    assert chat.context_limit == 300  # the smaller of the target's 4096 and the draft's
    pending = chat.prepare("hello")
    tokens = [t.id for t in chat.answer(pending)]
    plain = target.generate(pending.ids[None], do_sample=False, max_new_tokens=len(tokens),
                            eos_token_id=258)
    assert tokens == plain[0, len(pending.ids):].tolist() and lm.llm.evals


# --- from a profile -------------------------------------------------------------------------------

def gguf_profile(tiny_gguf, tmp_path, draft_lines: str):
    gguf = tiny_gguf(tmp_path / "tiny.gguf")
    profile = tmp_path / "g.toml"
    profile.write_text(f'[target]\nmodel = "{gguf}"\ndtype = "float32"\ndevice = "cpu"\n'
                       f'[draft]\nmodel = "{gguf}"\n{draft_lines}'
                       '[generation]\nchat_template = false\nmax_new_tokens = 6\n')
    return gguf, profile


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "history.sqlite3"))
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))


def test_run_loads_the_gguf_draft_in_llama_cpp(tmp_path, monkeypatch, isolated, fake_llama, tiny_gguf):
    from specgen.loading import load as models
    from specgen.loading.plan import resolve_role
    from specgen.profiles import ModelSpec

    gguf, profile = gguf_profile(tiny_gguf, tmp_path, 'runtime = "llama.cpp"\n')
    loaded = []
    # llama.cpp on the GGUF: here the same weights in torch, converted before the run (the
    # draft loads on a thread of its own while the run converts the target from that file)
    spec = ModelSpec(model=str(gguf), dtype="float32")
    weights = models.load_role(resolve_role("draft", spec))

    def load(path, threads, n_ctx):
        loaded.append((path, threads, n_ctx))
        return fake_llama(weights, eos=2)

    monkeypatch.setattr(llamacpp, "available", lambda: True)
    monkeypatch.setattr(llamacpp, "load", load)
    result = CliRunner().invoke(app, ["run", "-p", str(profile), "--format", "json", "abc"])
    assert result.exit_code == 0, result.output
    assert loaded == [(gguf, torch.get_num_threads(), llamacpp.ROOM)]
    out = json.loads(result.stdout)
    assert out["stats"]["draft_passes"] > 0


def test_a_gguf_drafts_tokenizer_is_read_once_then_known_to_match(tmp_path, monkeypatch, isolated,
                                                                   fake_llama, tiny_gguf):
    """A llama.cpp draft's tokenizer is read from its GGUF (slow in transformers) only to check
    it against the target's: once it matched, later runs skip it, until the file changes."""
    import os

    from specgen.loading import load as models
    from specgen.loading.plan import resolve_role
    from specgen.profiles import ModelSpec

    gguf, profile = gguf_profile(tiny_gguf, tmp_path, 'runtime = "llama.cpp"\n')
    spec = ModelSpec(model=str(gguf), dtype="float32")  # converted before the runs, as above
    weights = models.load_role(resolve_role("draft", spec))

    def load(path, threads, n_ctx):
        return fake_llama(weights, eos=2)

    monkeypatch.setattr(llamacpp, "available", lambda: True)
    monkeypatch.setattr(llamacpp, "load", load)
    from specgen.loading import tokenizer_cache

    read, real = [], tokenizer_cache.load_tokenizer

    def spy(source, *a, **k):
        read.append(source.gguf)
        return real(source, *a, **k)
    monkeypatch.setattr(tokenizer_cache, "load_tokenizer", spy)

    def gguf_reads():
        read.clear()
        result = CliRunner().invoke(app, ["run", "-p", str(profile), "--format", "json", "abc"])
        assert result.exit_code == 0, result.output
        return sum(name is not None for name in read)

    assert gguf_reads() == 1  # the draft's, read and checked against the converted target's
    assert gguf_reads() == 0  # known to match
    os.utime(gguf, ns=(gguf.stat().st_atime_ns, gguf.stat().st_mtime_ns + 10**9))
    assert gguf_reads() == 1  # another file (as far as anyone can tell): read and checked again


def test_a_llama_cpp_draft_without_llama_cpp_python_is_one_clear_error(tmp_path, monkeypatch, isolated, tiny_gguf):
    _, profile = gguf_profile(tiny_gguf, tmp_path, "")
    monkeypatch.setattr(llamacpp, "available", lambda: False)
    result = CliRunner().invoke(app, ["run", "-p", str(profile), "--draft-runtime", "llama.cpp", "abc"])
    assert result.exit_code == 2
    assert "needs llama-cpp-python: pip install llama-cpp-python" in result.stderr
    assert "Traceback" not in result.output


def test_bench_refuses_draft_vocab_with_a_llama_cpp_draft(tmp_path, isolated, tiny_gguf):
    _, profile = gguf_profile(tiny_gguf, tmp_path, 'runtime = "llama.cpp"\n')
    result = CliRunner().invoke(app, ["bench", "-p", str(profile), "--draft-vocab", "32"])
    assert result.exit_code == 2 and "Drop --draft-vocab" in result.stderr


def test_a_file_llama_cpp_cannot_load_is_one_clear_error(tmp_path, monkeypatch):
    def refuse(**kwargs):
        raise ValueError(f"Failed to load model from file: {kwargs['model_path']}")

    monkeypatch.setattr(sys.modules["llama_cpp"], "Llama", refuse, raising=False)
    monkeypatch.setattr(llamacpp, "available", lambda: True)
    with pytest.raises(ModelError, match="llama.cpp cannot load .*draft.runtime = \"transformers\""):
        llamacpp.load_draft(tmp_path / "odd.gguf", 2)


def test_the_real_llama_cpp_drafts_for_the_target_exactly(tmp_path, monkeypatch, tiny_gguf):
    """Where llama-cpp-python is installed: its draft of the same tiny GGUF, greedy."""
    monkeypatch.delitem(sys.modules, "llama_cpp")
    pytest.importorskip("llama_cpp")
    from specgen.loading import load as models
    from specgen.loading.plan import resolve_role
    from specgen.profiles import ModelSpec

    gguf = tiny_gguf(tmp_path / "tiny.gguf", merges=("a a",))
    spec = ModelSpec(model=str(gguf), dtype="float32", device="cpu")
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    target = models.load_role(resolve_role("target", spec))
    lm = llamacpp.load_draft(gguf, 1, room=8)  # outgrown: llama.cpp's cache made again, bigger
    ids = torch.tensor([[5, 9, 11, 3, 7]])
    plain = target.generate(ids, do_sample=False, max_new_tokens=24, min_new_tokens=24)
    # Fixed K: the draft drafts every step, so it reads the whole context whatever the
    # machine's timings (adaptive K may switch a tiny model's draft off on a busy machine).
    result = SpeculativeGenerator(target, lm, 4, adaptive=False).generate(ids, max_new_tokens=24)
    assert result.token_ids == plain[0, 5:].tolist()
    assert result.stats.accepted > 0  # the same weights: llama.cpp's guesses hold
    assert lm.room() >= 29 and lm.limit() == 128  # grown; the file's training context
