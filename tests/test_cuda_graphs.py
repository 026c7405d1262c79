"""The CUDA decoder's graph machinery on a CPU, with capture stood in for (fake_graphs): every
width captured when the cache is reserved, captured again after growth, a failed capture
retried once, and a second failure turning graphs off with one line that reaches the run's
stats, its JSON and `specgen run`'s output."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from typer.testing import CliRunner

from specgen.core.draws import draw_noise, pick_with
from specgen.core.engine import SpeculativeGenerator
from specgen.core.sampling import SamplingParams
from specgen.decoding.cuda import DEFAULT_VARIANTS, CudaDecoder, graph_keys
from specgen.decoding.graphs import retried
from specgen.decoding.lean import NO_SKIP
from specgen.errors import SpecgenWarning


def test_a_capture_is_tried_twice_with_a_reset_between():
    calls = []

    def failing(times):
        def attempt():
            calls.append("attempt")
            if calls.count("attempt") <= times:
                raise RuntimeError("first line\nsecond line")
        return attempt

    assert retried(failing(1), lambda: calls.append("reset"), 2) is None
    assert calls == ["attempt", "reset", "attempt"]
    calls.clear()
    assert retried(failing(2), lambda: calls.append("reset"), 2) == "RuntimeError: first line"
    assert calls == ["attempt", "reset", "attempt", "reset"]

    def bad_reset():
        raise ValueError("device lost")

    calls.clear()
    assert retried(failing(1), bad_reset, 2) == "ValueError: device lost"


def test_the_graph_keys_cover_every_width_of_every_kind_once():
    keys = list(graph_keys(set(DEFAULT_VARIANTS), 5))
    assert len(keys) == len(set(keys)) == 2 * 5 - 1  # (1, 1) serves both kinds
    assert {(m, n) for m, n, *_ in keys} == {(m, m) for m in range(1, 6)} | {
        (m, 1) for m in range(1, 6)}


@torch.inference_mode()
def test_reserve_captures_every_width_before_the_first_pass(tiny_model, fake_graphs):
    model = tiny_model("llama", vocab=64, hidden=64, layers=2)
    ids = torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(3))
    decoder, eager = CudaDecoder(model), CudaDecoder(model, static=True)
    captured = fake_graphs(decoder)
    decoder.reserve(40, 5)
    assert captured == list(graph_keys(set(DEFAULT_VARIANTS), 5))
    before = len(captured)
    # A target's life and a draft's catching up replay graphs, capturing nothing more, with
    # the captured form's results.
    eager.reserve(40)
    for width in range(1, 6):
        for rows in (width, 1):
            a, b = decoder.logits(ids[:width], rows), eager.logits(ids[:width], rows)
            assert torch.equal(a, b)
            decoder.crop(0), eager.crop(0)
    assert len(captured) == before
    # A pass wider than reserved: that pass alone. Growth moves the cache: every graph is
    # captured again, at once.
    assert torch.equal(decoder.logits(ids[:30], 1), eager.logits(ids[:30], 1))
    assert len(captured) == before + 1 and decoder.widest == 5
    decoder.reserve(600)
    assert decoder.capacity >= 600 and len(captured) == 2 * (before + 1)
    # A new kind of pass (hidden states, two rows) gets every reserved width of its kind.
    assert torch.equal(decoder.hidden(ids[30:33], 2), eager.hidden(ids[30:33], 2))
    assert len(captured) == 2 * (before + 1) + 4  # widths 2..5
    assert torch.equal(decoder.logits(ids[33:34], 1), eager.logits(ids[33:34], 1))
    assert len(captured) == 2 * (before + 1) + 4


@torch.inference_mode()
def test_a_capture_that_fails_once_is_retried(tiny_model, fake_graphs):
    decoder = CudaDecoder(tiny_model("llama", vocab=64, hidden=64, layers=2))
    captured = fake_graphs(decoder, failures=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: nothing went wrong in the end
        decoder.reserve(40, 5)
    assert decoder.graphs and decoder.graph_error is None and decoder.graphs_off is None
    assert len(captured) == 1 + len(list(graph_keys(set(DEFAULT_VARIANTS), 5)))
    assert len(decoder._captured) == len(captured) - 1


@torch.inference_mode()
def test_a_capture_that_fails_twice_turns_graphs_off_with_one_line(tiny_model, fake_graphs):
    model = tiny_model("llama", vocab=64, hidden=64, layers=2)
    ids = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(4))
    decoder = CudaDecoder(model)
    fake_graphs(decoder, failures=2)
    with pytest.warns(SpecgenWarning) as caught:
        decoder.reserve(40)
    assert [str(w.message) for w in caught] == [decoder.graphs_off]
    assert decoder.graphs_off == ("graphs off: RuntimeError: it->second->use_count > 0 INTERNAL "
                                  "ASSERT FAILED at \"CUDACachingAllocator.cpp\":2799; decoding "
                                  "several times slower")
    assert not decoder.graphs and not decoder._captured
    # It runs eagerly, as transformers does, bit for bit.
    assert torch.equal(decoder.logits(ids, 1), CudaDecoder(model).logits(ids, 1))


def failing_decoders(monkeypatch, fake_graphs):
    """Every generator's target decoder a CUDA decoder whose captures always fail."""
    import specgen.core.engine as engine

    def make(model, exact=False):
        decoder = CudaDecoder(model)
        fake_graphs(decoder, failures=10**6, error=RuntimeError("capture refused"))
        return decoder

    monkeypatch.setattr(engine, "make_decoder", make)


def test_a_generation_records_graphs_off_in_its_stats(monkeypatch, tiny_pair, fake_graphs):
    failing_decoders(monkeypatch, fake_graphs)
    target, draft = tiny_pair("llama")
    gen = SpeculativeGenerator(target, draft, 3, adaptive=False)
    with pytest.warns(SpecgenWarning, match="graphs off: RuntimeError: capture refused"):
        result = gen.generate([3, 17, 5], max_new_tokens=8)
    line = "graphs off: RuntimeError: capture refused; decoding several times slower"
    assert result.stats.graphs_off == line and result.stats.to_dict()["graphs_off"] == line
    assert len(result.token_ids) == 8


def test_specgen_run_prints_and_records_graphs_off_once(monkeypatch, tmp_path, tiny_profile,
                                                         fake_graphs):
    from specgen.app.store import load_runs
    from specgen.cli import app

    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "history.sqlite3"))
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    failing_decoders(monkeypatch, fake_graphs)
    line = "graphs off: RuntimeError: capture refused; decoding several times slower"
    result = CliRunner().invoke(app, ["run", "-p", str(tiny_profile), "--format", "json",
                                      "--max-new-tokens", "8", "hello"])
    assert result.exit_code == 0, result.output
    assert result.stderr.count(line) == 1
    assert json.loads(result.stdout)["stats"]["graphs_off"] == line
    (row,) = load_runs(tmp_path / "history.sqlite3")
    assert row["graphs_off"] == line


def test_a_generation_captures_target_and_draft_graphs_before_its_first_pass(monkeypatch, tiny_pair,
                                                                            fake_graphs):
    """The engine reserves both caches, for passes of up to K + 1 tokens, before the prompt's
    pass; every pass after replays a graph captured then (none is captured among the timed
    tokens), and the output is greedy decoding's."""
    import specgen.core.drafters as drafters
    import specgen.core.engine as engine

    captures: dict[str, list] = {}

    def maker(role):
        def make(model, exact=False):
            decoder = CudaDecoder(model)
            captures[role] = fake_graphs(decoder)
            return decoder
        return make

    monkeypatch.setattr(engine, "make_decoder", maker("target"))
    monkeypatch.setattr(drafters, "make_decoder", maker("draft"))
    target, draft = tiny_pair("llama")
    prompt = torch.tensor([3, 17, 5, 9])
    expected = target.generate(prompt[None], do_sample=False, max_new_tokens=20)[0, 4:].tolist()
    # The draft model alone: with prompt lookup beside it (the default method) the draft
    # also catches up on lookup's drafts, a pass wider than K + 1, captured on first use.
    gen = SpeculativeGenerator(target, draft, 4, adaptive=False, method="draft-model")
    assert gen.generate(prompt, max_new_tokens=20).token_ids == expected
    assert gen.stats.accepted > 0 and gen.stats.graphs_off is None
    reserved = list(graph_keys(set(DEFAULT_VARIANTS), 5))
    assert captures["target"] == reserved and captures["draft"] == reserved


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa"])
def test_a_head_drafts_from_the_states_of_replayed_graphs(kind, fitted_head, fake_graphs):
    """A drafting head's target passes replay from graphs captured with the states it reads
    (no longer eagerly): the head keeps the same drafts as beside the same decoder run
    eagerly, so it read the same states, and the output is the same."""
    from specgen.core.drafters import make_drafter

    target, head = fitted_head(kind)
    prompt = torch.randint(0, 64, (9,), generator=torch.Generator().manual_seed(4))
    results, keys = [], []
    for graphed in (False, True):
        drafter = make_drafter(kind, None, target.config.vocab_size, head=head)
        gen = SpeculativeGenerator(target, drafter, 4, adaptive=False, prepare=False)
        gen._decoder = CudaDecoder(target, static=True)  # the captured form, eagerly
        if graphed:
            keys = fake_graphs(gen._decoder)
        drafter.bind_target(gen._decoder, target)
        results.append(gen.generate(prompt, max_new_tokens=24))
    eager, replayed = results
    assert keys and gen._decoder._captured  # graphs captured, and kept, with the head bound
    assert replayed.token_ids == eager.token_ids
    assert replayed.sources == eager.sources and replayed.stats.accepted > 0


@pytest.mark.parametrize("sampled", [False, True])
@torch.inference_mode()
def test_a_drafts_chain_of_passes_replays_one_graph(sampled, tiny_model, fake_graphs):
    """A draft's k - 1 passes after its first (`chain`, its capture stood in for) draw what
    k - 1 one-token passes replayed one at a time draw, token for token and q to the bit,
    and leave the same cache; one capture per chain length, one replay per chain."""
    model = tiny_model("llama", vocab=64, hidden=64, layers=2)
    ids = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(6))
    params = SamplingParams(1.0 if sampled else 0.0, top_k=20 if sampled else 0)
    chained, single = CudaDecoder(model), CudaDecoder(model)
    keys = fake_graphs(chained)
    fake_graphs(single)
    pick = lambda out, noise: pick_with(out, params, noise)  # noqa: E731
    for decoder in (chained, single):
        decoder.reserve(64, 5)
        decoder.logits(ids, 1)
    for turn in range(3):
        first = ids[turn : turn + 1]
        gen = torch.Generator().manual_seed(turn)
        noise = draw_noise(4, torch.zeros(64), gen) if sampled else None
        tokens, qs = chained.chain(first, 4, pick, noise, params)
        token, want = first, []
        for i in range(4):
            want.append(pick(single.logits(token, 1)[0], None if noise is None else noise[i]))
            token = want[-1][0].view(1)
        assert tokens.tolist() == [t.item() for t, _ in want]
        assert torch.equal(qs, torch.stack([q for _, q in want]))
        assert chained.length == single.length
        assert torch.equal(chained.logits(tokens[-1:], 1), single.logits(token, 1))
    assert keys.count(("chain", 4)) == 1
    assert chained._chains[(4, True, NO_SKIP, params, sampled)][0].replays == 3


@torch.inference_mode()
def test_a_chain_whose_capture_fails_twice_runs_eagerly_with_graphs_off(tiny_model, fake_graphs):
    model = tiny_model("llama", vocab=64, hidden=64, layers=2)
    ids = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(7))
    decoder, eager = CudaDecoder(model), CudaDecoder(model)
    fake_graphs(decoder)
    decoder.reserve(64, 5)
    for d in (decoder, eager):
        d.logits(ids, 1)
    fake_graphs(decoder, failures=2)  # the passes' graphs are captured: the chain's two tries fail
    pick = lambda out, noise: pick_with(out, SamplingParams(), noise)  # noqa: E731
    with pytest.warns(SpecgenWarning) as caught:
        tokens, _ = decoder.chain(ids[-1:], 3, pick, None, SamplingParams())
    assert [str(w.message) for w in caught] == [decoder.graphs_off] and not decoder.graphs
    want, token = [], ids[-1:]
    for _ in range(3):
        token = eager.logits(token, 1)[0].argmax(-1).view(1)
        want.append(token.item())
    assert tokens.tolist() == want
