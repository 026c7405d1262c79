"""The lean decoder computes what transformers' forward computes, step for step: closely for
a draft, bit for bit for a target."""

import pytest
import torch

from specgen.kernels import linear, rows
from specgen.kernels import prepare
from specgen.decoding import HFDecoder, LeanDecoder, lean_supported, make_decoder
from specgen.decoding.lean import Projections
from specgen.kernels.quantize import QuantLinear, apply


def steps(decoder, ids: torch.Tensor) -> list[torch.Tensor]:
    """A drafter's life: read a prompt, draft one token at a time, catch up on several,
    drop rejected positions, go on."""
    out = [decoder.hidden(ids[:7]), decoder.hidden(ids[7:8]), decoder.hidden(ids[8:11])]
    decoder.crop(9)
    out.append(decoder.hidden(ids[9:12]))
    out.append(decoder.hidden(ids[12:300]))  # past the first capacity: the cache grows
    decoder.crop(290)
    out.append(decoder.hidden(ids[290:291]))
    assert decoder.length == 291
    return out


@pytest.mark.parametrize("quantization", [None, "int8-dyn"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@torch.inference_mode()
def test_lean_decoder_matches_transformers(family, quantization, tiny_model):
    """Also with an int8-dyn draft, whose q/k/v and gate/up layers the lean decoder joins
    into one fbgemm call each (Qwen2's q/k/v have biases; Llama's have none)."""
    model = tiny_model(family, vocab=64, hidden=32, layers=2)
    if quantization:
        apply(model, quantization, verifier=False)
    lean = make_decoder(model)
    assert lean_supported(model) and isinstance(lean, LeanDecoder)
    assert all(p.joined == bool(quantization) for layer in lean.projections for p in layer)
    ids = torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(0))
    for _ in range(2):  # a reset decoder starts afresh
        for got, reference in zip(steps(lean, ids), steps(HFDecoder(model), ids)):
            torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)
        lean.reset()
        assert lean.length == 0


def target_steps(decoder, ids: torch.Tensor) -> list[torch.Tensor]:
    """A target's life: the prompt's pass, verify passes over several tokens, rejected drafts
    dropped, one-token steps, a cache that grows."""
    out = [decoder.logits(ids[:7], 1), decoder.logits(ids[7:12], 5), decoder.logits(ids[12:13], 1)]
    decoder.crop(9)
    out += [decoder.logits(ids[9:14], 5), decoder.logits(ids[14:300], 3)]
    decoder.crop(290)
    out.append(decoder.logits(ids[290:291], 1))
    assert decoder.length == 291
    return out


@pytest.mark.parametrize("ops", ["C", "PyTorch"])
@pytest.mark.parametrize("quantization", ["int8-dyn", "int4-dyn", "float32", "bfloat16"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@torch.inference_mode()
def test_lean_target_decoder_is_bit_identical_to_transformers(family, quantization, ops,
                                                              without_kernel, tiny_model):
    """A verifier attends row by row (quantized, or fp32/bf16 with specgen's linear kernel);
    the lean decoder then serves the target, and its logits must be transformers' own to the
    last bit, or speculation would not reproduce the target's greedy output. Both with
    rows.c (rotary, cache and attention one C call; fp32) and where it cannot be built
    (PyTorch's ops)."""
    if ops == "PyTorch":
        without_kernel("rows")
    else:
        assert rows.library() is not None
    model = tiny_model(family, vocab=64, hidden=64, layers=2)
    if quantization.endswith("-dyn"):
        prepare(model, "target", quantization)  # a verifier's: row attention
    else:
        assert linear.library() is not None
        prepare(model.to(getattr(torch, quantization)), "target")
    lean = make_decoder(model, exact=True)
    assert isinstance(lean, LeanDecoder) and lean.rows
    ids = torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(1))
    for got, reference in zip(target_steps(lean, ids), target_steps(HFDecoder(model), ids)):
        assert got.shape == reference.shape and torch.equal(got, reference)


@torch.inference_mode()
def test_a_drafts_lean_pass_attends_in_one_c_call(tiny_model, monkeypatch):
    """A draft's bits are its own (only a target's must be transformers'), so its lean
    passes take rows.c's one call for rotary, cache write and attention, as a target's do,
    not PyTorch's dozen ops a layer."""
    model = tiny_model("qwen2", vocab=64, hidden=64, layers=2)
    lean = make_decoder(model)
    assert isinstance(lean, LeanDecoder) and not lean.rows and rows.library() is not None
    calls = []
    real = rows.rope_attend
    monkeypatch.setattr(rows, "rope_attend", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    reference = HFDecoder(model)
    for ids in (torch.arange(5), torch.tensor([7]), torch.tensor([9, 3])):
        torch.testing.assert_close(lean.hidden(ids), reference.hidden(ids), atol=1e-5, rtol=1e-5)
    assert calls == [5, 5, 1, 1, 2, 2]  # each pass, each of the 2 layers


def test_targets_without_row_attention_keep_transformers_forward(tiny_model):
    """Elsewhere the lean decoder's attention is not transformers' to the bit: a float
    target keeps transformers' forward, while a draft of the same model goes lean."""
    model = tiny_model("qwen2")
    assert isinstance(make_decoder(model, exact=True), HFDecoder)
    assert isinstance(make_decoder(model), LeanDecoder)


def test_joined_int8_dyn_layers_give_each_layers_own_output():
    torch.manual_seed(0)
    layers = [QuantLinear.from_linear(torch.nn.Linear(32, n, bias=b), "int8-dyn")
              for n, b in ((48, True), (16, False), (16, True))]
    for layer in layers:
        layer.batch_invariant = False  # a draft's
    x = torch.randn(3, 32)
    joined = Projections(layers)
    assert joined.joined and joined.layer is not layers[0]  # one weight, the layers' side by side
    for got, layer in zip(joined(x), layers):
        assert torch.equal(got, layer(x))
    layers[0].batch_invariant = True  # a verifier's layers are never joined
    assert not Projections(layers).joined


def test_sliding_window_models_keep_transformers_forward(tiny_model):
    model = tiny_model("qwen2", use_sliding_window=True, sliding_window=4)
    assert not lean_supported(model) and isinstance(make_decoder(model), HFDecoder)
