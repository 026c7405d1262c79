"""The CUDA decoder's logic on the CPU (the same code, without graph capture): static cache
indexing, rollback by length and every width, bit for bit against transformers' forward in
fp32; its captured form (whole capacity, masked) within rounding; greedy speculation through it
equal to `generate`. The tests marked `cuda` run where a GPU is present."""

from __future__ import annotations

import pytest
import torch

from specgen.core.drafters import ModelDrafter
from specgen.core.engine import SpeculativeGenerator
from specgen.core.sampling import residual, rejection_accept, rejection_verify, sample
from specgen.decoding import HFDecoder, make_decoder
from specgen.decoding.cuda import GRAPH_WIDTH, CudaDecoder
from specgen.decoding.lean import Skip

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def target_steps(decoder, ids: torch.Tensor) -> list[torch.Tensor]:
    """A target's life: a prompt, verify passes, rejected drafts dropped (rollback), one-token
    steps, a cache that grows past its first capacity, then every width a pass can have."""
    out = [decoder.logits(ids[:7], 1), decoder.logits(ids[7:12], 5), decoder.logits(ids[12:13], 1)]
    decoder.crop(9)
    out += [decoder.logits(ids[9:14], 5), decoder.logits(ids[14:300], 3)]
    decoder.crop(290)
    out.append(decoder.logits(ids[290:291], 1))
    for width in range(1, GRAPH_WIDTH + 1):
        out.append(decoder.logits(ids[291:291 + width], width))
        decoder.crop(291)
    out.append(decoder.hidden(ids[291:294], 2))
    assert decoder.length == 294
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@torch.inference_mode()
def test_eager_passes_are_bit_identical_to_transformers(family, tiny_model):
    model = tiny_model(family, vocab=64, hidden=64, layers=2)
    ids = torch.randint(0, 64, (340,), generator=torch.Generator().manual_seed(1))
    decoder = CudaDecoder(model)
    assert not decoder.graphs and not decoder.static  # on a CPU: eager, exact attention
    for _ in range(2):  # a reset decoder starts afresh over its old cache
        got = target_steps(decoder, ids)
        reference = target_steps(HFDecoder(model), ids)
        for a, b in zip(got, reference, strict=True):
            assert a.shape == b.shape and torch.equal(a, b)
        assert decoder.capacity == 512  # grown by doubling from 256, contents kept
        decoder.reset()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@torch.inference_mode()
def test_the_captured_form_matches_within_rounding(family, tiny_model):
    """Passes of up to GRAPH_WIDTH tokens as a graph computes them (attention over the whole
    capacity, masked, the query heads of a key/value head stacked) give transformers' logits
    to rounding, at every position, width and cache size."""
    model = tiny_model(family, vocab=64, hidden=64, layers=2)
    ids = torch.randint(0, 64, (340,), generator=torch.Generator().manual_seed(2))
    got = target_steps(CudaDecoder(model, static=True), ids)
    for a, b in zip(got, target_steps(HFDecoder(model), ids), strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=2e-6)


@torch.inference_mode()
def test_reserving_room_moves_the_cache_without_changing_results(tiny_model):
    model = tiny_model("llama", vocab=64, hidden=64, layers=2)
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(3))
    plain, reserved = CudaDecoder(model), CudaDecoder(model)
    a = [plain.logits(ids[:20], 2)]
    b = [reserved.logits(ids[:20], 2)]
    reserved.reserve(2000)
    assert reserved.capacity == 2048 and plain.capacity == 256
    a.append(plain.logits(ids[20:25], 5))
    b.append(reserved.logits(ids[20:25], 5))
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@torch.inference_mode()
def test_skipped_sub_layers_add_nothing_and_leave_the_rest_alone(tiny_model):
    """A pass with layer 1's MLP skipped equals the model with that MLP's output zeroed; a
    pass skipping everything is the final norm of the embeddings."""
    model = tiny_model("qwen2", vocab=64, hidden=64, layers=2)
    ids = torch.randint(0, 64, (9,), generator=torch.Generator().manual_seed(4))
    skipped = CudaDecoder(model).hidden(ids, 9, skip=Skip(mlp={1}))
    every = Skip(attention={0, 1}, mlp={0, 1})
    assert torch.equal(CudaDecoder(model).hidden(ids, 9, skip=every),
                       model.model.norm(model.model.embed_tokens(ids)))
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.zero_()
    assert torch.equal(skipped, CudaDecoder(model).hidden(ids, 9))


def cuda_generator(target, draft, k: int, adaptive: bool, **decoder) -> SpeculativeGenerator:
    """A generator whose target and draft run on CudaDecoder (the engine picks it on a GPU)."""
    gen = SpeculativeGenerator(target, ModelDrafter(draft, target.config.vocab_size), k, adaptive)
    gen._decoder = CudaDecoder(target, **decoder)
    gen.drafter.lm.decoder = CudaDecoder(draft, **decoder)
    return gen


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("k, adaptive", [(1, False), (3, False), (8, False), (6, True)])
def test_greedy_speculation_through_the_cuda_decoder_equals_generate(family, k, adaptive, tiny_pair):
    target, draft = tiny_pair(family)
    prompt = torch.tensor([[3, 17, 5, 9, 22]])
    expected = target.generate(prompt, do_sample=False, max_new_tokens=40)[0, 5:].tolist()
    gen = cuda_generator(target, draft, k, adaptive)
    result = gen.generate(prompt[0], max_new_tokens=40)
    assert result.token_ids == expected
    assert result.stats.accepted > 0  # the pair's drafts were really verified


def test_make_decoder_picks_the_cuda_decoder_on_one_gpu_unless_told_not_to(monkeypatch, tiny_model):
    import specgen.decoding

    model = tiny_model("llama")
    assert not isinstance(make_decoder(model), CudaDecoder)
    monkeypatch.setattr(specgen.decoding, "on_one_gpu", lambda model: True)  # as on a GPU
    assert isinstance(make_decoder(model, exact=True), CudaDecoder)
    assert not isinstance(make_decoder(tiny_model("qwen2", use_sliding_window=True,
                                                  sliding_window=4)), CudaDecoder)
    monkeypatch.setenv("SPECGEN_CUDA_DECODER", "0")
    assert isinstance(make_decoder(model, exact=True), HFDecoder)


def reference_rejection(p, q, draft_ids, generator):
    """The host-side algorithm the device-side one replaced."""
    k = draft_ids.shape[0]
    rows = torch.arange(k)
    accepted = torch.rand(k, generator=generator) * q[rows, draft_ids] < p[rows, draft_ids]
    n = int(accepted.cumprod(0).sum())
    if n == k:
        return n, sample(p[k], generator)
    return n, sample(residual(p[n], q[n]), generator)


def test_device_side_acceptance_draws_what_the_host_side_algorithm_drew():
    """Same random stream, same outcome, step by step: the acceptance test and the row drawn
    from are chosen on the device without changing what is drawn."""
    g = torch.Generator().manual_seed(0)
    outcomes = set()
    for trial in range(300):
        k = trial % 5
        p = torch.softmax(torch.randn(k + 1, 12, generator=g) * 2, -1)
        q = torch.softmax(torch.randn(k, 12, generator=g) * 2, -1)
        drafts = torch.multinomial(q, 1, generator=g)[:, 0] if k else torch.empty(0, dtype=torch.long)
        seed = int(torch.randint(0, 2**31, (1,), generator=g))
        n_ref, t_ref = reference_rejection(p, q, drafts, torch.Generator().manual_seed(seed))
        n_dev, t_dev = rejection_accept(p, q, drafts, torch.Generator().manual_seed(seed))
        assert (int(n_dev), int(t_dev)) == (n_ref, int(t_ref))
        assert rejection_verify(p, q, drafts, torch.Generator().manual_seed(seed))[0] == n_ref
        outcomes.add(n_ref == k)
    assert outcomes == {True, False}  # both branches (bonus and resample) were exercised


# --- on a GPU --------------------------------------------------------------------------------

@cuda
@torch.inference_mode()
def test_graph_replay_gives_the_eager_captured_forms_bits(tiny_model):
    model = tiny_model("qwen2", vocab=64, hidden=64, layers=2).cuda()
    ids = torch.randint(0, 64, (340,), generator=torch.Generator().manual_seed(5)).cuda()
    graphed = CudaDecoder(model)
    assert graphed.graphs and graphed.static
    eager = CudaDecoder(model, graphs=False, static=True)
    graphed.reserve(512), eager.reserve(512)
    for a, b in zip(target_steps(graphed, ids), target_steps(eager, ids), strict=True):
        assert torch.equal(a, b)
    assert graphed.graph_error is None and len(graphed._captured) >= GRAPH_WIDTH


@cuda
def test_make_decoder_picks_the_cuda_decoder_on_a_gpu(tiny_model):
    assert isinstance(make_decoder(tiny_model("llama").cuda(), exact=True), CudaDecoder)


@cuda
def test_fp32_greedy_speculation_on_the_gpu_equals_generate(tiny_model, sharpen):
    target, draft = (tiny_model("llama", vocab=64, hidden=64, layers=3, seed=0),
                     tiny_model("llama", vocab=64, hidden=32, layers=1, seed=1))
    sharpen(target, 4.0)
    target, draft = target.cuda(), draft.cuda()
    prompt = torch.tensor([[3, 17, 5, 9, 22]], device="cuda")
    expected = target.generate(prompt, do_sample=False, max_new_tokens=40)[0, 5:].tolist()
    gen = SpeculativeGenerator(target, draft, 4, adaptive=False)
    assert isinstance(gen._decoder, CudaDecoder) and gen._decoder.graphs
    assert gen.generate(prompt[0], max_new_tokens=40).token_ids == expected


@cuda
def test_a_speculative_step_syncs_with_the_host_once(tiny_model):
    """Greedy, fixed K, a draft that never ends its own drafts: each step's only sync is the
    read of its outcome (CUDA's sync debug mode counts them)."""
    import warnings

    target, draft = tiny_model("llama", vocab=64, layers=2).cuda(), tiny_model("llama", vocab=64,
                                                                                 seed=1).cuda()
    gen = SpeculativeGenerator(target, draft, 3, adaptive=False)
    gen.generate([1, 2, 3], max_new_tokens=8)  # captures every graph first
    stream = gen.stream([1, 2, 3], max_new_tokens=40)
    next(stream)  # the prompt's pass (its prefix check syncs once)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tokens = list(stream)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    steps = gen.stats.target_passes - 1
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    assert tokens and syncs <= steps


def on_the_cuda_decoder(monkeypatch):
    """Make every generator's target decoder a CudaDecoder in its captured form (static
    cache, masked whole-capacity attention), as on a GPU, so that drafters bound to the
    target's decoder (self, heads) run through it on a CPU."""
    import specgen.core.engine as engine

    monkeypatch.setattr(engine, "make_decoder", lambda model, exact=False: CudaDecoder(model, static=True))


@pytest.mark.parametrize("k, adaptive", [(1, False), (4, False), (6, True)])
def test_self_drafting_through_the_cuda_decoder_equals_generate(monkeypatch, k, adaptive, tiny_pair):
    from specgen.core.drafters import SelfDrafter

    on_the_cuda_decoder(monkeypatch)
    target, _ = tiny_pair("qwen2")
    prompt = torch.tensor([[3, 17, 5, 9, 22]])
    expected = target.generate(prompt, do_sample=False, max_new_tokens=40)[0, 5:].tolist()
    gen = SpeculativeGenerator(target, SelfDrafter(Skip(mlp={1})), k, adaptive)
    assert isinstance(gen._decoder, CudaDecoder)
    result = gen.generate(prompt[0], max_new_tokens=40)
    assert result.token_ids == expected
    assert result.stats.proposed > 0


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_a_head_drafting_through_the_cuda_decoder_equals_generate(monkeypatch, kind, fitted_head):
    from specgen.core.drafters import make_drafter

    on_the_cuda_decoder(monkeypatch)
    target, head = fitted_head(kind)
    prompt = torch.tensor([[3, 17, 5, 9, 22]])
    expected = target.generate(prompt, do_sample=False, max_new_tokens=40)[0, 5:].tolist()
    gen = SpeculativeGenerator(target, make_drafter(kind, None, target.config.vocab_size, head=head), 4,
                              prepare=False)  # the cached fitted target stays as it is
    assert isinstance(gen._decoder, CudaDecoder) and gen._decoder.capture_layers is not None
    result = gen.generate(prompt[0], max_new_tokens=40)
    assert result.token_ids == expected
    assert result.stats.accepted > 0  # the head drafted from the captured states


@cuda
@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa"])
def test_a_heads_target_replays_its_graphs_with_the_states_it_reads(kind, fitted_head):
    """On a GPU: a head's target replays from graphs captured with the states the head reads,
    and the head keeps the same drafts as beside the eager captured form, with the same output."""
    from specgen.core.drafters import make_drafter

    target, head = fitted_head.__wrapped__(kind)  # a pair of its own: it moves to the GPU
    target = target.cuda()
    prompt = torch.randint(0, 64, (9,), generator=torch.Generator().manual_seed(4)).cuda()
    results = []
    for graphs in (False, True):
        drafter = make_drafter(kind, None, target.config.vocab_size, head=head)
        gen = SpeculativeGenerator(target, drafter, 4, adaptive=False, prepare=False)
        gen._decoder = CudaDecoder(target, graphs=graphs, static=True)
        drafter.bind_target(gen._decoder, target)
        results.append(gen.generate(prompt, max_new_tokens=24))
        assert gen._decoder.graph_error is None and bool(gen._decoder._captured) == graphs
    eager, replayed = results
    assert replayed.token_ids == eager.token_ids and replayed.sources == eager.sources
