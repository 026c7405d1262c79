"""The draft's lean decoder computes what transformers' forward computes, step for step."""

import pytest
import torch

from specgen.decoder import HFDecoder, LeanDecoder, lean_supported, make_decoder
from tiny import tiny_model


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


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@torch.inference_mode()
def test_lean_decoder_matches_transformers(family):
    model = tiny_model(family, vocab=64, hidden=32, layers=2)
    assert lean_supported(model) and isinstance(make_decoder(model), LeanDecoder)
    ids = torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(0))
    for lean, reference in zip(steps(LeanDecoder(model), ids), steps(HFDecoder(model), ids)):
        torch.testing.assert_close(lean, reference, atol=1e-5, rtol=1e-5)


def test_sliding_window_models_keep_transformers_forward():
    model = tiny_model("qwen2", use_sliding_window=True, sliding_window=4)
    assert not lean_supported(model) and isinstance(make_decoder(model), HFDecoder)
