"""The Python API gets the CLI's guarantees: `SpeculativeGenerator` prepares plain
transformers models as the profile path does (unless told not to), `specgen.prepare` is
that preparation, and `specgen.load` gives a profile loaded as `specgen run` loads it."""

from __future__ import annotations

from copy import deepcopy

import pytest
import torch

import specgen
from specgen import SpeculativeGenerator
from specgen.decoding.lean import LeanDecoder, attends_by_rows
from specgen.errors import ConfigError
from specgen.kernels import linear

needs_kernels = pytest.mark.skipif(linear.library() is None, reason="no C compiler or no AVX2")


def fresh_bf16_pair(tiny_pair):
    """A bf16 pair of our own, built afresh: the shared tiny pair is not to be changed in
    place, and another test may have prepared it (a copy would be prepared too)."""
    return tuple(m.to(torch.bfloat16) for m in tiny_pair.__wrapped__("qwen2"))


def greedy(model, ids, n=40):
    out = model.generate(ids[None], do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, len(ids):].tolist()


def test_the_public_names():
    from specgen.app.session import Session, load
    from specgen.kernels import prepare

    assert specgen.prepare is prepare and specgen.load is load and specgen.Session is Session
    assert {"prepare", "load", "Session"} <= set(specgen.__all__)


@needs_kernels
@pytest.mark.parametrize("k", [2, 5])
def test_a_generator_prepares_plain_bf16_models_and_stays_exact(k, tiny_pair):
    target, draft = fresh_bf16_pair(tiny_pair)
    gen = SpeculativeGenerator(target, draft, k, adaptive=False)
    assert attends_by_rows(target) and isinstance(gen._decoder, LeanDecoder)
    assert all(type(m) is not torch.nn.Linear for m in target.modules())
    for seed in range(3):
        ids = torch.randint(0, 64, (60,), generator=torch.Generator().manual_seed(seed))
        result = gen.generate(ids, max_new_tokens=40)
        assert result.token_ids == greedy(target, ids)
        assert result.stats.accepted > 0


def test_prepare_false_leaves_the_models_as_they_are(tiny_pair):
    target, draft = fresh_bf16_pair(tiny_pair)
    SpeculativeGenerator(target, draft, 4, prepare=False)
    assert not attends_by_rows(target)
    assert all(type(m) is torch.nn.Linear for m in target.modules()
               if isinstance(m, torch.nn.Linear))


@needs_kernels
def test_a_prepared_model_still_serves_padded_batches(tiny_pair):
    target, _ = fresh_bf16_pair(tiny_pair)
    plain = deepcopy(target)
    specgen.prepare(target, "target")
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert target.generate(ids, **kwargs).tolist() == plain.generate(ids, **kwargs).tolist()


def test_load_gives_a_ready_session(tiny_profile):
    session = specgen.load(str(tiny_profile), max_new_tokens=6, num_speculative_tokens=2)
    result = session.generate("hello")
    assert 0 < len(result.token_ids) <= 6 and result.stats.k_max == 2
    assert isinstance(session.decode(result.token_ids), str)
    ids = session.encode("hello")
    assert result.token_ids == greedy(session.pair.target, ids, 6)[:len(result.token_ids)]


def test_load_validates_before_anything_loads(monkeypatch):
    monkeypatch.setattr("specgen.app.session.open_session",
                        lambda *a, **k: pytest.fail("the models were about to load"))
    with pytest.raises(ConfigError, match="specgen.load: generation.temperature must be a finite"):
        specgen.load("qwen-coder-demo", temperature=float("nan"))
    with pytest.raises(ConfigError, match="Unknown override 'temprature'"):
        specgen.load("qwen-coder-demo", temprature=0.5)


def what_runs(gen: SpeculativeGenerator) -> dict:
    """What a generator runs: the target's decoder and attention, the draft's decoder, who
    drafts (each drafter's class and lookup's n-gram range) and the K policy."""
    drafter = gen.drafter
    model = getattr(drafter, "model_drafter", drafter)
    lookup = getattr(drafter, "lookup_drafter", None)
    return {"decoder": type(gen._decoder).__name__, "rows": attends_by_rows(gen.target),
            "drafter": type(drafter).__name__, "model_drafter": type(model).__name__,
            "draft_decoder": type(model.lm.decoder).__name__,
            "lookup": (lookup.max_ngram, lookup.min_ngram) if lookup else None,
            "k_max": gen.k_max, "adaptive": gen.adaptive}


def test_the_one_call_api_runs_what_the_cli_runs(tiny_profile):
    """`SpeculativeGenerator(target, draft)` on models transformers loaded builds what
    `specgen.load` (the CLI's path, the profile's defaults) builds for the same models."""
    from transformers import AutoModelForCausalLM

    from specgen.profiles import SpeculationSpec

    cli = SpeculationSpec()  # what a profile runs unless it says otherwise
    session = specgen.load(str(tiny_profile), num_speculative_tokens=cli.num_speculative_tokens)
    assert session.profile.speculation.method == cli.method == "hybrid"
    paths = [tiny_profile.parent / name for name in ("target", "draft")]
    target, draft = (AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32) for p in paths)
    assert what_runs(SpeculativeGenerator(target, draft)) == what_runs(session.generator)
    ids = session.encode("hello there")
    n = 12
    result = specgen.SpeculativeGenerator(target, draft).generate(ids, max_new_tokens=n)
    assert result.token_ids == greedy(target, ids, n)[:len(result.token_ids)]


def test_method_picks_the_drafter_of_a_draft_model(tiny_pair):
    target, draft = fresh_bf16_pair(tiny_pair)
    assert type(SpeculativeGenerator(target, draft, method="draft-model").drafter).__name__ == "ModelDrafter"
    assert type(SpeculativeGenerator(target, draft).drafter).__name__ == "HybridDrafter"
    with pytest.raises(ConfigError, match="Unknown drafting method"):
        SpeculativeGenerator(target, draft, method="hybird")
