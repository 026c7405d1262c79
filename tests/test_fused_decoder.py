"""FusedDecoder (decoding/fused.py): the CUDA decoder's logits within rounding over
prompts, widths and rollback; every row of a verify pass bit for bit the one-token pass at its
position; greedy speculation through it equal to its own one-token greedy decoding. Without a
GPU, eagerly on the CPU with the kernels in Triton's interpreter (conftest.py turns it on);
on a GPU, replayed from CUDA graphs, in bf16 too."""

from __future__ import annotations

import copy

import pytest
import torch

from specgen.core.drafters import ModelDrafter
from specgen.core.engine import SpeculativeGenerator
from specgen.decoding import make_decoder
from specgen.decoding.cuda import GRAPH_WIDTH, CudaDecoder
from specgen.decoding.fused import FusedDecoder, fused_supported
from specgen.decoding.lean import Skip
from specgen.kernels import gpu

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])  # interpreter: no bf16
pytestmark = pytest.mark.skipif(not gpu.available(DEVICE), reason="Triton cannot run here")


def token_ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def steps(decoder, ids: torch.Tensor) -> list[torch.Tensor]:
    """A prompt wider than a graph (PyTorch's path), verify passes, rollback, one-token steps."""
    out = [decoder.logits(ids[:GRAPH_WIDTH + 3], 2), decoder.logits(ids[36:41], 5)]
    decoder.crop(38)
    out += [decoder.logits(ids[38:39], 1), decoder.logits(ids[39:43], 4), decoder.hidden(ids[43:45], 2)]
    return out


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


@pytest.mark.parametrize("family, config", [("llama", {}), ("qwen2", {}),  # qwen2: q/k/v biases
                                            ("llama", {"rope_scaling": LLAMA3_ROPE})])
@torch.inference_mode()
def test_logits_match_the_cuda_decoder_within_rounding(family, config, tiny_model):
    model = tiny_model(family, vocab=64, hidden=64, layers=2, **config).to(DEVICE)
    ids = token_ids(60, 1)
    expected = steps(CudaDecoder(model), ids)
    fused = FusedDecoder(model)
    for a, b in zip(steps(fused, ids), expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert fused.length == 45


@torch.inference_mode()
def test_the_model_keeps_one_copy_of_its_weights(tiny_model):
    """q/k/v and gate/up are concatenated once; the model's layers read slices of it."""
    model = tiny_model("qwen2", vocab=64, hidden=64, layers=1).to(DEVICE)
    before = model(torch.arange(5, device=DEVICE)[None]).logits
    layer = FusedDecoder(model).fused[0]
    attn = model.model.layers[0].self_attn
    assert attn.k_proj.weight.data_ptr() == layer.qkv.data[attn.q_proj.out_features:].data_ptr()
    assert attn.v_proj.bias.untyped_storage().data_ptr() == layer.qkv.bias.untyped_storage().data_ptr()
    assert FusedDecoder(model).fused is FusedDecoder(model).fused  # made once per model
    assert torch.equal(model(torch.arange(5, device=DEVICE)[None]).logits, before)


def test_joined_weights_are_of_the_models_kind(tiny_model):
    """Built under inference mode for a model made outside it, the joined weights stay plain
    tensors: the model still runs and trains; and inference tensors for a model made inside."""
    model = tiny_model("qwen2", vocab=64, hidden=64, layers=1).to(DEVICE)
    with torch.inference_mode():
        FusedDecoder(model)
    model(torch.arange(5, device=DEVICE)[None]).logits.sum().backward()
    assert model.model.layers[0].self_attn.k_proj.weight.grad is not None
    with torch.inference_mode():
        inside = tiny_model("qwen2", vocab=64, hidden=64, layers=1).to(DEVICE)
        FusedDecoder(inside)
        inside(torch.arange(5, device=DEVICE)[None])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@torch.inference_mode()
def test_every_row_of_a_verify_pass_is_the_one_token_pass(family, dtype, tiny_model):
    model = tiny_model(family, vocab=64, hidden=64, layers=2).to(DEVICE, dtype)
    ids = token_ids(40, 2)
    one = FusedDecoder(model)
    one.logits(ids[:20])
    plain = torch.cat([one.logits(ids[t:t + 1]) for t in range(20, 26)])  # positions 20..25
    wide = FusedDecoder(model)
    wide.logits(ids[:20])
    for width in (2, 6):  # each verified, then rolled back
        assert torch.equal(wide.logits(ids[20:20 + width], width), plain[:width])
        wide.crop(20)
    wide.logits(ids[20:23], 3)
    one.crop(23)
    skip = Skip(attention={1}, mlp={0})  # a self-drafting pass: rows alone as well
    assert torch.equal(wide.hidden(ids[23:26], 3, skip),
                       torch.cat([one.hidden(ids[t:t + 1], 1, skip) for t in range(23, 26)]))


def test_greedy_speculation_equals_its_own_greedy_decoding(tiny_pair):
    target, draft = tiny_pair("llama")
    if DEVICE != "cpu":  # the pair is shared by other tests: moved as a copy
        target, draft = copy.deepcopy(target).to(DEVICE), copy.deepcopy(draft).to(DEVICE)
    prompt = torch.tensor([3, 17, 5, 9, 22], device=DEVICE)
    plain = FusedDecoder(target)
    with torch.inference_mode():
        token, expected = plain.logits(prompt).argmax(-1), []
        for _ in range(20):
            expected.append(int(token))
            token = plain.logits(token).argmax(-1)
    gen = SpeculativeGenerator(target, ModelDrafter(draft, target.config.vocab_size), 4, False)
    gen._decoder = FusedDecoder(target)
    gen.drafter.lm.decoder = CudaDecoder(draft)
    result = gen.generate(prompt, max_new_tokens=20)
    assert result.token_ids == expected
    assert result.stats.accepted > 0


def test_make_decoder_picks_the_fused_decoder_where_triton_runs(monkeypatch, tiny_model):
    import specgen.decoding

    model = tiny_model("llama").to(DEVICE)
    monkeypatch.setattr(specgen.decoding, "on_one_gpu", lambda model: True)  # as on a GPU
    assert isinstance(make_decoder(model, exact=True), FusedDecoder)
    monkeypatch.setattr(specgen.decoding, "available", lambda device: False)  # no Triton
    decoder = make_decoder(model, exact=True)
    assert type(decoder) is CudaDecoder
    monkeypatch.undo()
    monkeypatch.setattr(specgen.decoding, "on_one_gpu", lambda model: True)
    monkeypatch.setenv("SPECGEN_FUSED_KERNELS", "0")
    assert type(make_decoder(model, exact=True)) is CudaDecoder
    assert not fused_supported(tiny_model("llama", hidden_act="gelu"))
    assert not fused_supported(tiny_model("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    assert fused_supported(tiny_model("llama", rope_scaling=LLAMA3_ROPE))  # by position alone


@torch.inference_mode()
def test_an_int4_gpu_model_runs_on_its_own_int4_values_kept_once(tiny_model):
    """int4-gpu layers (here through tinygemm's CPU twin) are read back into the kernels'
    layout and replaced: the logits are the tinygemm model's to its bf16 activations'
    rounding, rows alone, and the model's own forward runs on the kernels."""
    from specgen.kernels import cuda_int4

    model = cuda_int4.apply(tiny_model("llama", vocab=64, hidden=128, layers=1).to(DEVICE))
    ids = token_ids(24, 3)
    expected = CudaDecoder(model).logits(ids[:20], 20)  # tinygemm, bf16 activations
    fused = FusedDecoder(model)
    assert not any(isinstance(m, cuda_int4.Int4Linear) for m in model.modules())
    got = fused.logits(ids[:20], 20)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
    one = FusedDecoder(model)
    one.logits(ids[:16])
    rows = torch.cat([one.logits(ids[t:t + 1]) for t in range(16, 20)])
    assert torch.equal(got[16:], rows)
    # its own norms apart from the kernels' (the fused pass folds them into the linears),
    # whose int4 sums carry q + 128 until the offset cancels (kernels/gpu/tiles.py): fp32's
    # rounding of such sums, a little above 1e-5 here
    torch.testing.assert_close(model(ids[None, :20]).logits[0], got, atol=1e-4, rtol=1e-5)


@pytest.mark.skipif(DEVICE != "cpu", reason="the stand-in capture runs on the CPU")
@torch.inference_mode()
def test_graphs_captured_at_reserve_read_rope_tables_of_their_capacity(tiny_model, fake_graphs):
    """CudaDecoder's capture at reserve, with this decoder's pass: growth rebuilds the rotary
    tables before the graphs are captured again, and replays give the eager passes' bits."""
    model = tiny_model("llama", vocab=64, hidden=64, layers=2)
    ids = token_ids(300, 5)
    decoder, eager = FusedDecoder(model), FusedDecoder(model, static=True)
    captured = fake_graphs(decoder)
    decoder.reserve(40, 3), eager.reserve(300)
    assert captured and decoder._tables[0].shape[0] == decoder.capacity
    before = len(captured)
    decoder.reserve(300)  # growth: tables first, then every graph again
    assert decoder._tables[0].shape[0] == decoder.capacity >= 300 and len(captured) == 2 * before
    for width in (1, 3):
        assert torch.equal(decoder.logits(ids[:width], width), eager.logits(ids[:width], width))
        decoder.crop(0), eager.crop(0)
