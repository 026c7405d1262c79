"""Draft heads (EAGLE-1/2, EAGLE-3, Medusa-1) on tiny targets: greedy output equal to the
target's own, drafts equal to the head recomputed from scratch (so the cache, the pairs and
their positions line up), the sampled distribution exactly the target's, and the decoders'
capture of hidden states."""

from copy import deepcopy

import pytest
import torch

from specgen.core.drafters import make_drafter
from specgen.core.engine import SpeculativeGenerator
from specgen.core.head_drafters import EagleDrafter, MedusaDrafter
from specgen.core.sampling import SamplingParams
from specgen.decoding import HFDecoder, LeanDecoder
from specgen.errors import ConfigError, SpecgenWarning

N = 40
KINDS = [("eagle", None), ("eagle3", 48), ("medusa", None)]
GREEDY = SamplingParams()


def reference(target, ids, n=N):
    out = target.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, ids.shape[1]:].tolist()


def prompt(seed=0, vocab=64, length=9):
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def generator(kind, target, head, k, adaptive=False, prepare=False, **kw):
    """`prepare` False: the cached `fitted_head` targets must not be prepared in place."""
    drafter = make_drafter(kind, None, target.config.vocab_size, head=head, **kw)
    return SpeculativeGenerator(target, drafter, k, adaptive=adaptive, prepare=prepare)


@pytest.mark.parametrize("kind, draft_vocab", KINDS)
@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_equals_target_greedy(kind, draft_vocab, k, fitted_head):
    target, head = fitted_head(kind, draft_vocab=draft_vocab)
    accepted = 0
    for seed in range(3):
        ids = prompt(seed)
        result = generator(kind, target, head, k, adaptive=seed == 2).generate(ids, max_new_tokens=N)
        assert result.token_ids == reference(target, ids)
        accepted += result.stats.accepted
    assert accepted > 0  # the head really drafts, and some drafts survive


def scratch_drafts(kind, target, head, tokens, k):
    """Greedy drafts recomputed from the whole context, no cache: what the drafter must give."""
    with torch.no_grad():
        out = target.base_model(input_ids=tokens[None, :-1], output_hidden_states=True)
        embed = target.get_input_embeddings()
        if kind == "medusa":
            f = out.last_hidden_state[0, -1]
            return [int(torch.nn.functional.linear(s[:-1](f), s[-1].weight).argmax())
                    for s in list(head)[:k]]
        if kind == "eagle":
            feats, fused = out.last_hidden_state[0], None
        else:
            fused = torch.cat([out.hidden_states[i][0] for i in head.config.aux_layers], -1)
            feats = head.fc(fused)
        toks, drafts = tokens[1:], []
        for _ in range(k):
            positions = torch.arange(feats.shape[0])
            if kind == "eagle":
                o = head(feats[None], embed(toks)[None], positions)[0, -1]
                d = int(target.lm_head(o).argmax())
            else:
                o, logits = head(feats[None], embed(toks)[None], positions, fused=False)
                o, d = o[0, -1], int(head.target_ids(logits[0, -1].argmax()))
            drafts.append(d)
            feats, toks = torch.cat([feats, o[None]]), torch.cat([toks, torch.tensor([d])])
        return drafts


@pytest.mark.parametrize("kind, draft_vocab", KINDS)
def test_drafts_equal_the_head_recomputed_from_scratch(kind, draft_vocab, fitted_head):
    """After every step (accepts, rejections, bonus tokens), the cached drafter proposes what
    the head proposes when run over the whole context from scratch."""
    target, head = fitted_head(kind, draft_vocab=draft_vocab)
    gen = generator(kind, target, head, 4)
    drafter, checked = gen.drafter, []
    propose = drafter.propose

    def checking(tokens, k, params, rng, stop_below=0.0):
        ids, q = propose(tokens, k, params, rng, stop_below)
        checked.append(ids.tolist() == scratch_drafts(kind, target, head, tokens, k)[: len(ids)])
        return ids, q

    drafter.propose = checking
    for seed in range(2):
        gen.generate(prompt(seed), max_new_tokens=24)
    gen.generate(torch.cat([prompt(1), prompt(5)], 1), max_new_tokens=8)  # a longer context
    assert len(checked) > 10 and all(checked)


@pytest.mark.parametrize("kind, draft_vocab", KINDS)
def test_the_lean_decoder_captures_what_transformers_does(kind, draft_vocab, fitted_head):
    """A target on the lean decoder (prepared as a verifier) gives its head the same states:
    the same drafts, the same output."""
    from specgen.kernels import prepare

    target, head = fitted_head(kind, draft_vocab=draft_vocab)
    lean = prepare(deepcopy(target), "target")
    runs = {}
    for name, model in (("hf", target), ("lean", lean)):
        gen = generator(kind, model, deepcopy(head), 4)
        decoder = gen._decoder
        assert isinstance(decoder, LeanDecoder if name == "lean" else HFDecoder)
        result = gen.generate(prompt(7), max_new_tokens=N)
        runs[name] = (result.token_ids, result.stats.accepted)
    assert runs["lean"] == runs["hf"]


def test_a_decoder_keeps_nothing_unless_a_head_asks(fitted_head):
    target, head = fitted_head("eagle")
    gen = SpeculativeGenerator(target, make_drafter("prompt-lookup", None, 64), 4, prepare=False)
    gen.generate(prompt(0), max_new_tokens=8)
    assert gen._decoder.capture_layers is None and gen._decoder.captured == []
    gen = generator("eagle3", *fitted_head("eagle3", draft_vocab=48), 4)
    assert gen._decoder.capture_layers == (2, 4, 5)
    gen.generate(prompt(0), max_new_tokens=8)
    assert gen._decoder.captured == []  # every pass was taken by the drafter


def test_medusa_drafts_at_most_one_token_per_head(fitted_head):
    target, head = fitted_head("medusa")
    gen = generator("medusa", target, head, 8)
    result = gen.generate(prompt(2), max_new_tokens=N)
    assert max(result.stats.k_per_step) <= len(head) == 4


def test_chat_reuse_and_reset_keep_heads_exact(fitted_head):
    """A prompt extending the last one reuses the caches (the head's too); reset forgets."""
    target, head = fitted_head("eagle")
    gen = generator("eagle", target, head, 4)
    first = gen.generate(prompt(3), max_new_tokens=12).token_ids
    longer = torch.cat([prompt(3), torch.tensor([first]), prompt(4)], 1)
    assert gen.generate(longer, max_new_tokens=N).token_ids == reference(target, longer)
    gen.reset()
    assert gen.generate(prompt(6), max_new_tokens=N).token_ids == reference(target, prompt(6))


def test_a_head_method_needs_a_head_of_its_kind(fitted_head):
    target, head = fitted_head("eagle")
    with pytest.raises(ConfigError, match="kind = \"medusa\""):
        make_drafter("medusa", None, 64, head=head)
    with pytest.raises(ConfigError, match="has none"):
        make_drafter("eagle", None, 64)
    assert isinstance(make_drafter("eagle", None, 64, head=head), EagleDrafter)
    assert isinstance(make_drafter("medusa", None, 64, head=fitted_head("medusa")[1]), MedusaDrafter)


def test_drafting_over_the_first_rows_only(fitted_head):
    """`head_rows` cuts an EAGLE head's output layer (the target's) to its first ids: drafts
    stay below it and the output stays the target's."""
    target, head = fitted_head("eagle")
    gen = generator("eagle", target, head, 4, head_rows=40)
    seen = []
    propose = gen.drafter.propose
    gen.drafter.propose = lambda *a, **kw: seen.append(propose(*a, **kw)) or seen[-1]
    assert gen.generate(prompt(1), max_new_tokens=N).token_ids == reference(target, prompt(1))
    assert seen and all(int(ids.max()) < 40 for ids, _ in seen if len(ids))


# --- the distribution ---------------------------------------------------------------------------

SAMPLED = [  # (kind, draft vocabulary, K, new tokens, warping)
    ("eagle", None, 3, 3, SamplingParams(1.0)),
    ("eagle3", 12, 4, 3, SamplingParams(0.8, top_k=5)),
    ("medusa", None, 3, 3, SamplingParams(1.2, top_p=0.9)),
]


def peaked(fitted_head, kind, draft_vocab=None):
    """A vocabulary of 16 and a peaked target, shallow but for EAGLE-3 (7 layers)."""
    return fitted_head(kind, vocab=16, draft_vocab=draft_vocab, layers=7 if kind == "eagle3" else 2,
                       hidden=32, scale=10.0)


@pytest.mark.parametrize("kind, draft_vocab, k, n, params", SAMPLED)
def test_sampled_output_has_the_target_distribution(kind, draft_vocab, k, n, params, distribution, fitted_head):
    target, head = peaked(fitted_head, kind, draft_vocab)
    joint = distribution.target_joint(target, distribution.PROMPT, n, params)
    gen = generator(kind, target, head, k)
    samples, sources = distribution.draw(gen, n, params, samples=3000)
    assert min(sources["accepted"], sources["resampled"]) > 60  # both branches exercised
    pvalue = distribution.chi_square_pvalue(samples, joint)
    assert pvalue > distribution.ALPHA, f"{kind}: speculative samples differ from the target (p = {pvalue:.2e})"


def test_a_broken_sampler_is_caught_with_a_head(monkeypatch, distribution, fitted_head):
    """The control: a sampler that keeps every draft emits the head's own distribution, and
    the same test must reject it (or the test could not tell a head from the target)."""
    import specgen.core.engine
    from specgen.core.sampling import sample

    def accept_all(p, q, draft_ids, generator=None):
        k = draft_ids.shape[0]  # as rejection_accept answers: the count as a tensor
        return torch.tensor(k, device=p.device), sample(p[k], generator)

    monkeypatch.setattr(specgen.core.engine, "rejection_accept", accept_all)
    target, head = peaked(fitted_head, "eagle")
    params = SamplingParams(1.0)
    samples, _ = distribution.draw(generator("eagle", target, head, 2), 3, params, samples=2000)
    joint = distribution.target_joint(target, distribution.PROMPT, 3, params)
    assert distribution.chi_square_pvalue(samples, joint) < distribution.ALPHA


def test_first_rows_of_a_quantized_output_layer(fitted_head):
    """An int8-dyn target's output layer is read back row by row for an EAGLE head that drafts
    over the first ids; greedy output stays the quantized target's own."""
    from specgen.core.head_drafters import output_rows
    from specgen.kernels import prepare

    target, head = fitted_head("eagle")
    quantized = prepare(deepcopy(target), "target", "int8-dyn")
    rows = output_rows(quantized.get_output_embeddings(), 40, torch.float32, torch.device("cpu"))
    exact = target.get_output_embeddings().weight[:40]
    assert rows.shape == (40, 64) and (rows - exact).abs().max() < 0.02 * exact.abs().max()
    gen = generator("eagle", quantized, head, 4, head_rows=40)
    result = gen.generate(prompt(4), max_new_tokens=N)
    assert result.token_ids == reference(quantized, prompt(4)) and result.stats.accepted > 0


def test_a_pass_the_head_never_saw_restarts_it_and_the_output_stays_exact(fitted_head):
    """If the head misses a pass's states (a gap in what it read), it starts afresh from the
    next pass instead of pairing features with the wrong positions."""
    target, head = fitted_head("eagle")
    gen = generator("eagle", target, head, 3)
    decoder, drafter = gen._decoder, gen.drafter
    rollback, dropped = drafter.rollback, []

    def forgetful(n_valid):
        if len(dropped) < 2 and decoder.length > 20:  # lose the newest pass, twice
            dropped.append(decoder.captured.pop())
        rollback(n_valid)

    drafter.rollback = forgetful
    result = gen.generate(prompt(8), max_new_tokens=N)
    assert len(dropped) == 2 and result.token_ids == reference(target, prompt(8))
    assert drafter._base > 0  # it restarted past the gap


def recorded(drafter) -> list[tuple[list[int], list[float]]]:
    """Every proposal the drafter makes from now on: its tokens and q (to the bit)."""
    proposals: list[tuple[list[int], list[float]]] = []
    propose = drafter.propose

    def wrapped(*args, **kwargs):
        drafts, q = propose(*args, **kwargs)
        proposals.append((drafts.tolist(), [] if q is None else q.flatten().tolist()))
        return drafts, q

    drafter.propose = wrapped
    return proposals


def head_runs(kind, draft_vocab, fitted_head, modes, graphs=None):
    """For each mode ("exact", "static": the graph's form eagerly, "graphs": replayed, the
    capture stood in for by `graphs`, or real on a GPU): the output and every proposal."""
    target, head = fitted_head(kind, draft_vocab=draft_vocab)
    device = "cuda" if torch.cuda.is_available() and graphs is None else "cpu"
    if device == "cuda":
        target, head = deepcopy(target).cuda(), deepcopy(head).cuda()
    ids = prompt(3).to(device)
    out = {}
    for mode in modes:
        if kind == "medusa":  # no cache: its graph is every head's logits from one feature
            drafter = MedusaDrafter(head, target.config.vocab_size, graphs=mode == "graphs")
        else:
            drafter = EagleDrafter(head, target.config.vocab_size, graphs=mode == "graphs")
            drafter.static = mode != "exact"
        gen = SpeculativeGenerator(target, drafter, 4, adaptive=False, prepare=False)
        replays = graphs(drafter) if mode == "graphs" and graphs is not None else None
        proposals = recorded(drafter)
        result = gen.generate(ids, max_new_tokens=N)
        out[mode] = (result.token_ids, proposals, replays, drafter)
    return target, ids, out


@pytest.mark.parametrize("kind, draft_vocab", [("eagle", None), ("eagle3", 48)])
def test_a_heads_passes_replay_graphs_over_a_static_cache(kind, draft_vocab, fitted_head,
                                                                  fake_head_graphs):
    """The head's graphs (the draft step's and each catch-up width's, their capture stood in
    for on the CPU) draft what the same passes run eagerly over the static cache draft,
    tokens and q to the bit, through rollbacks; the output stays the target's own."""
    target, ids, runs = head_runs(kind, draft_vocab, fitted_head, ("exact", "static", "graphs"),
                                  fake_head_graphs)
    want = reference(target, ids)
    for tokens, *_ in runs.values():
        assert tokens == want
    assert runs["graphs"][1] == runs["static"][1]
    replays, drafter = runs["graphs"][2], runs["graphs"][3]
    # every proposal but the first (its catch-up reads the prompt) replayed its catch-up,
    # and its draft steps after the first
    assert replays.count("_catch_up_body") == len(runs["graphs"][1]) - 1
    assert replays.count("_draft_body") > len(runs["graphs"][1])
    assert sorted(drafter._catch_ups) == list(range(1, 6))  # K + 1 = 5
    assert drafter._graph is not None and drafter.graphs_off is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind, draft_vocab", [("eagle", None), ("eagle3", 48), ("medusa", None)])
def test_on_a_gpu_a_heads_draft_steps_replay_their_graph(kind, draft_vocab, fitted_head):
    eager = "exact" if kind == "medusa" else "static"  # a Medusa head has no cache
    target, ids, runs = head_runs(kind, draft_vocab, fitted_head, (eager, "graphs"))
    assert runs["graphs"][0] == runs[eager][0] == reference(target, ids)
    assert runs["graphs"][1] == runs[eager][1]
    drafter = runs["graphs"][3]
    assert drafter._graph is not None and drafter.graphs_off is None


def test_a_medusa_heads_logits_replay_one_graph(fitted_head, fake_head_graphs):
    target, ids, runs = head_runs("medusa", None, fitted_head, ("exact", "graphs"), fake_head_graphs)
    assert runs["graphs"][0] == runs["exact"][0] == reference(target, ids)
    assert runs["graphs"][1] == runs["exact"][1]  # tokens and q to the bit
    replays, drafter = runs["graphs"][2], runs["graphs"][3]
    assert replays == ["_heads_body"] * len(runs["graphs"][1])  # one replay a proposal
    assert drafter.graphs_off is None


@pytest.mark.parametrize("kind, draft_vocab", [("eagle", None), ("medusa", None)])
def test_a_heads_capture_that_fails_twice_leaves_it_eager_and_says_so_once(kind, draft_vocab,
                                                                           fitted_head):
    """The shared capture (decoding/graphs.py) asked for graphs on a CPU: it fails, is
    retried once, and the head drafts eagerly with one line that reaches the run's stats."""
    target, head = fitted_head(kind, draft_vocab=draft_vocab)
    ids = prompt(3)
    make = MedusaDrafter if kind == "medusa" else EagleDrafter
    drafter = make(head, target.config.vocab_size, graphs=True)
    tries = []
    capture = drafter._capture_graph
    drafter._capture_graph = lambda *a: tries.append(1) or capture(*a)
    gen = SpeculativeGenerator(target, drafter, 4, adaptive=False, prepare=False)
    with pytest.warns(SpecgenWarning) as caught:
        result = gen.generate(ids, max_new_tokens=N)
    assert len(tries) == 2 and drafter.graphs is False
    assert [str(w.message) for w in caught] == [drafter.graphs_off]
    assert drafter.graphs_off.startswith("graphs off: ") and result.stats.graphs_off == drafter.graphs_off
    assert result.token_ids == reference(target, ids)
