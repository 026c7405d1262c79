"""Loading heads in the reference layouts (checkpoints built here in exactly those layouts):
each loads and drafts exactly; a wrong layout, a head for another hidden size or vocabulary,
a missing d2t: one clear line, exit 2. And profiles naming heads."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specgen.cli import app
from specgen.core.drafters import make_drafter
from specgen.core.engine import SpeculativeGenerator
from specgen.errors import ConfigError, ModelError
from specgen.heads.layout import check_head, guess_kind, load_head
from specgen.heads.modules import Eagle3Head, HeadConfig
from specgen.heads.train import new_head
from specgen.profiles import load_profile

LAYOUTS = [("eagle", "pytorch_model.bin"), ("eagle", "model.safetensors"),
           ("eagle3", "pytorch_model.bin"), ("eagle3", "model.safetensors"),
           ("medusa", "medusa_lm_head.pt"), ("medusa", "medusa_lm_head.safetensors")]


def reference(target, ids, n=24):
    out = target.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("kind, file", LAYOUTS)
def test_a_reference_checkpoint_loads_and_drafts_exactly(
        tmp_path, kind, file, fitted_head, reference_state, save_reference):
    target, head = fitted_head(kind, draft_vocab=48 if kind == "eagle3" else None)
    state = reference_state(head)
    if kind == "eagle" and file.endswith(".bin"):  # EAGLE-1's .bin carries an embedding copy
        state["embed_tokens.weight"] = torch.randn(64, 64)
    folder = save_reference(head, target, tmp_path / "head", file, state=state)
    loaded = load_head(folder, kind, target.config)
    assert loaded.kind == kind
    assert check_head(folder, kind, target.config) == loaded.config  # from the headers alone
    for key, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    if kind == "medusa":  # counted from the keys: the published config says 2
        assert len(loaded) == 4
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(1))
    gen = SpeculativeGenerator(target, make_drafter(kind, None, 64, head=loaded), 4, prepare=False)
    result = gen.generate(ids, max_new_tokens=24)
    assert result.token_ids == reference(target, ids) and result.stats.accepted > 0


def test_eagle_fc_bias_follows_the_weights(tmp_path, fitted_head, reference_state, save_reference):
    target, head = fitted_head("eagle")
    state = reference_state(head)
    del state["fc.bias"]  # as EAGLE-LLaMA3-Instruct-8B ("bias": false)
    folder = save_reference(head, target, tmp_path / "h", "pytorch_model.bin", state=state)
    assert load_head(folder, "eagle", target.config).fc.bias is None


def test_an_eagle3_head_narrower_than_its_target_brings_its_own_embedding(
        tmp_path, fitted_head, reference_state, save_reference):
    """EAGLE-3 heads with target_hidden_size (the 70B's) are narrower than the target and
    carry embed_tokens of their own width."""
    target = fitted_head("eagle3", draft_vocab=48)[0]
    c = target.config
    head = Eagle3Head(HeadConfig(kind="eagle3", hidden=32, vocab=64, heads=4, kv_heads=2,
                                 head_dim=8, intermediate=64, draft_vocab=64, target_hidden=64,
                                 aux_layers=(2, 4, 5), max_positions=c.max_position_embeddings))
    state = reference_state(head)
    config = {"hidden_size": 32, "target_hidden_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 64, "draft_vocab_size": 64,
              "intermediate_size": 64}
    with pytest.raises(ModelError, match="needs its own embed_tokens"):
        load_head(save_reference(head, target, tmp_path / "a", "model.safetensors", state, config),
                  "eagle3", c)
    state["embed_tokens.weight"] = torch.randn(64, 32)
    loaded = load_head(save_reference(head, target, tmp_path / "b", "model.safetensors", state,
                                      config), "eagle3", c)
    assert loaded.embed_tokens.weight.shape == (64, 32)
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(2))
    gen = SpeculativeGenerator(target, make_drafter("eagle3", None, 64, head=loaded), 3, prepare=False)
    assert gen.generate(ids, max_new_tokens=24).token_ids == reference(target, ids)


def test_eagle3_reads_aux_layer_ids_from_its_config(tmp_path, fitted_head, reference_config, save_reference):
    target, head = fitted_head("eagle3", draft_vocab=48)
    config = {**json.loads(json.dumps(reference_config(head, target))),
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}}
    folder = save_reference(head, target, tmp_path / "h", "model.safetensors", config=config)
    assert load_head(folder, "eagle3", target.config).config.aux_layers == (1, 3, 6)


# --- refusals: one line each -----------------------------------------------------------------


def refusal(save_reference, tmp_path, kind, file, make, target_config, **save) -> str:
    target, head = make()
    folder = save_reference(head, target, tmp_path / "head", file, **save)
    with pytest.raises(ModelError) as e:
        load_head(folder, kind, target_config)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_a_wrong_layout_names_the_kind_it_is(tmp_path, fitted_head, save_reference):
    target = fitted_head("eagle")[0]
    msg = refusal(save_reference, tmp_path, "eagle3", "model.safetensors", lambda: fitted_head("eagle"),
                  target.config)
    assert 'not a EAGLE-3 head' in msg and 'kind = "eagle"' in msg
    msg = refusal(save_reference, tmp_path / "b", "medusa", "model.safetensors", lambda: fitted_head("eagle"),
                  target.config)
    assert "no Medusa head weights" in msg and 'kind = "eagle"' in msg


def test_a_file_of_no_known_layout_is_refused(tmp_path, fitted_head):
    target = fitted_head("eagle")[0]
    folder = tmp_path / "h"
    folder.mkdir()
    torch.save({"transformer.fusion_fc.weight": torch.zeros(2, 2)}, folder / "pytorch_model.bin")
    with pytest.raises(ModelError, match="none of EAGLE, EAGLE-3 or Medusa"):
        load_head(folder, "eagle", target.config)
    torch.save([1, 2], folder / "pytorch_model.bin")
    with pytest.raises(ModelError, match="not a state dict"):
        load_head(folder, "eagle", target.config)


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa"])
def test_a_head_for_another_hidden_size_is_refused(
        tmp_path, kind, tiny_model, fitted_head, eagle3_head, save_reference):
    other = tiny_model("llama", vocab=64, hidden=32, layers=8, seed=5)
    head = eagle3_head(other, 48) if kind == "eagle3" else new_head(kind, other, intermediate=64)
    target = fitted_head("eagle")[0]  # hidden 64
    file = "medusa_lm_head.pt" if kind == "medusa" else "pytorch_model.bin"
    msg = refusal(save_reference, tmp_path, kind, file, lambda: (other, head), target.config)
    tensor, found, needed = {"eagle": ("fc.weight", [32, 64], [64, 128]),
                             "eagle3": ("fc.weight", [32, 96], [64, 192]),
                             "medusa": ("0.0.linear.weight", [32, 32], [64, 64])}[kind]
    assert f"{tensor} has shape {found}, but on this target it must be {needed}" in msg, msg
    assert "trained for a target of hidden size 32; the profile's target has 64" in msg


# A tensor to remove, one to add, and one to cut short, per kind: every tensor is checked, in
# every Medusa head (not only the first), whatever its role.
DAMAGE = {
    "eagle": ("layers.0.mlp.up_proj.weight", "layers.0.input_layernorm.weight",
              "layers.0.mlp.down_proj.weight"),
    "eagle3": ("midlayer.hidden_norm.weight", "midlayer.self_attn.rotary_emb.inv_freq",
               "lm_head.weight"),
    "medusa": ("3.0.linear.bias", "2.0.linear.scale", "2.0.linear.weight"),
}


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa"])
def test_a_missing_an_unexpected_or_a_misshapen_tensor_is_refused(
        tmp_path, kind, fitted_head, reference_state, save_reference):
    target, head = fitted_head(kind, draft_vocab=48 if kind == "eagle3" else None)
    gone, added, cut = DAMAGE[kind]
    file = "medusa_lm_head.safetensors" if kind == "medusa" else "model.safetensors"
    make = lambda: (target, head)  # noqa: E731
    state = reference_state(head)
    shape = list(state.pop(gone).shape)
    msg = refusal(save_reference, tmp_path / "gone", kind, file, make, target.config, state=state)
    assert f"lacks {gone} (shape {shape} for this target)" in msg and "incomplete" in msg, msg
    state = {**reference_state(head), added: torch.ones(8)}
    msg = refusal(save_reference, tmp_path / "added", kind, file, make, target.config, state=state)
    assert f"has {added} (shape [8]), which a" in msg and "does not have" in msg, msg
    state = reference_state(head)
    whole = list(state[cut].shape)
    state[cut] = state[cut][:, :-1].contiguous()
    msg = refusal(save_reference, tmp_path / "cut", kind, file, make, target.config, state=state)
    short = [whole[0], whole[1] - 1]
    assert f"{cut} has shape {short}, but on this target it must be {whole}" in msg
    assert "config.json and its weights disagree" in msg, msg


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa"])
def test_a_head_for_another_vocabulary_is_refused(
        tmp_path, kind, tiny_model, fitted_head, eagle3_head, save_reference):
    other = tiny_model("llama", vocab=256, hidden=64, layers=8, seed=5)
    head = eagle3_head(other, 200) if kind == "eagle3" else new_head(kind, other, intermediate=64)
    target = fitted_head("eagle")[0]  # vocabulary 64
    file = "medusa_lm_head.pt" if kind == "medusa" else "model.safetensors"
    msg = refusal(save_reference, tmp_path, kind, file, lambda: (other, head), target.config)
    assert "vocabulary of 256 tokens" in msg or "outside 0..63" in msg, msg


def test_a_missing_d2t_is_refused(tmp_path, fitted_head, eagle3_head, reference_state, save_reference):
    target, head = fitted_head("eagle3", draft_vocab=48)
    state = reference_state(head)
    del state["d2t"]
    msg = refusal(save_reference, tmp_path, "eagle3", "pytorch_model.bin", lambda: (target, head), target.config,
                  state=state)
    assert "no d2t map" in msg and "48 of 64" in msg
    # With the whole vocabulary, draft ids are target ids: no map is needed.
    full = eagle3_head(target)
    state = reference_state(full)
    del state["d2t"]
    folder = save_reference(full, target, tmp_path / "full", "pytorch_model.bin", state=state)
    assert torch.equal(load_head(folder, "eagle3", target.config).d2t, torch.zeros(64, dtype=torch.long))


def test_eagle3_needs_three_distinct_layers(tmp_path, tiny_model, fitted_head, save_reference):
    shallow = tiny_model("llama", vocab=64, hidden=64, layers=6, seed=5)
    target, head = fitted_head("eagle3", draft_vocab=48)
    folder = save_reference(head, target, tmp_path / "h", "model.safetensors")
    with pytest.raises(ModelError, match="7 layers or more"):
        load_head(folder, "eagle3", shallow.config)


def test_guess_kind():
    assert guess_kind(["fc.weight", "layers.0.mlp.up_proj.weight"]) == "eagle"
    assert guess_kind(["fc.weight", "midlayer.norm.weight", "d2t"]) == "eagle3"
    assert guess_kind(["0.0.linear.weight", "0.1.weight"]) == "medusa"
    assert guess_kind(["lm_head.weight"]) is None


# --- profiles and the command line ------------------------------------------------------------


def write(tmp_path, name, text):
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_profile_head_fields_are_validated(tmp_path):
    base = '[target]\nmodel = "t"\n'
    ok = load_profile(str(write(tmp_path, "ok", base + '[draft]\nhead = "h"\nkind = "medusa"\n'
                                "[speculation]\nmethod = \"medusa\"\n")))
    assert ok.draft.head == "h" and ok.draft.kind == "medusa" and not ok.draft.has_model
    cases = {
        '[draft]\nhead = "h"\n': "needs draft.kind",
        '[draft]\nmodel = "d"\nkind = "eagle"\n': "needs draft.head",
        '[draft]\nhead = "h"\nkind = "eagle2"\n': "Did you mean 'eagle'",
        '[draft]\nhead = "h"\nkind = "eagle"\n[speculation]\nmethod = "draft-model"\n':
            "needs a \\[draft\\] model",
        '[draft]\nmodel = "d"\n[speculation]\nmethod = "eagle"\n': "drafts with a eagle head",
        '[draft]\nhead = "h"\nkind = "eagle"\n[speculation]\nmethod = "medusa"\n':
            "draft.kind = 'eagle'",
        '[draft]\nkind = "eagle"\n': "needs a 'model'",
    }
    for i, (text, message) in enumerate(cases.items()):
        with pytest.raises(ConfigError, match=message):
            load_profile(str(write(tmp_path, f"bad{i}", base + text)))
    with pytest.raises(ConfigError, match="belongs in \\[draft\\]"):
        load_profile(str(write(tmp_path, "t", '[target]\nmodel = "t"\nhead = "h"\nkind = "eagle"\n')))


@pytest.fixture
def head_profile(tiny_profile, tmp_path, monkeypatch, save_reference, tiny_model):
    """A tiny profile drafting with an EAGLE head saved as a trained head's name."""
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "history.sqlite3"))
    monkeypatch.setenv("SPECGEN_HEADS_DIR", str(tmp_path / "heads"))
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_profile.parent / "target", dtype=torch.float32)
    head = new_head("eagle", target, intermediate=64)
    save_reference(head, target, tmp_path / "heads" / "tiny-eagle", "model.safetensors")
    # A head of another model: hidden size 128 (config.json and weights), on this 64-wide target.
    wide = tiny_model("llama", vocab=target.config.vocab_size, hidden=128, layers=2, seed=5)
    save_reference(new_head("eagle", wide, intermediate=64), wide,
                   tmp_path / "heads" / "wide-eagle", "model.safetensors")
    # The same in EAGLE-1's published layout: a torch pickle, as the hub's EAGLE heads ship.
    save_reference(new_head("eagle", wide, intermediate=64), wide,
                   tmp_path / "heads" / "wide-eagle-bin", "pytorch_model.bin")
    state = {k: v for k, v in head.state_dict().items() if k != "layers.0.mlp.up_proj.weight"}
    save_reference(head, target, tmp_path / "heads" / "cut-eagle", "model.safetensors", state=state)

    def profile(head="tiny-eagle", kind="eagle"):
        return write(tmp_path, f"p-{kind}", f'extends = "{tiny_profile}"\n[draft]\nhead = "{head}"\n'
                     f'kind = "{kind}"\n[speculation]\nmethod = "{kind}"\n')
    return profile


def test_run_drafts_with_a_profiles_head(head_profile):
    result = CliRunner().invoke(app, ["run", "-p", str(head_profile()), "--format", "json",
                                      "-n", "12", "def f(x):"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["draft"] == "tiny-eagle" and answer["stats"]["new_tokens"] == 12


@pytest.mark.parametrize("head, kind, message", [
    ("missing-head", "eagle", "has been trained yet"),
    ("tiny-eagle", "medusa", "no Medusa head weights"),
    ("./nowhere/at/all", "eagle", "is not a folder"),
])
def test_a_bad_head_is_one_line_and_exit_2(head_profile, head, kind, message):
    result = CliRunner().invoke(app, ["run", "-p", str(head_profile(head, kind)), "hello"])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("head, message", [
    ("wide-eagle", "fc.weight has shape [128, 256], but on this target it must be [64, 128]: "
                   "this head was trained for a target of hidden size 128; the profile's target "
                   "has 64: use a head made for "),
    ("wide-eagle-bin", "fc.weight has shape [128, 256], but on this target it must be "
                       "[64, 128]: this head was trained for a target of hidden size 128"),
    ("cut-eagle", "lacks layers.0.mlp.up_proj.weight (shape [64, 64] for this target)"),
])
def test_a_head_of_another_model_is_refused_before_the_target_loads(
        head_profile, monkeypatch, head, message):
    from specgen.loading import load

    def no_weights(*args, **kwargs):
        raise AssertionError("the target's weights were loaded")

    monkeypatch.setattr(load, "load_role", no_weights)
    result = CliRunner().invoke(app, ["run", "-p", str(head_profile(head)), "hello"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())  # as one line, however the console wraps it
    assert message in said and "Traceback" not in said, said


def test_bench_runs_the_profiles_head_beside_the_draft_model(head_profile, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"category": "code-completion", "prompt": "def add(a, b):"}\n')
    out = tmp_path / "b.json"
    result = CliRunner().invoke(app, ["bench", "-p", str(head_profile()), "--prompts", str(prompts),
                                      "-n", "8", "--method", "draft-model", "--contestants",
                                      "baseline,adaptive,eagle", "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["config"]["head"] == "tiny-eagle" and doc["config"]["head_kind"] == "eagle"
    assert {m["contestant"] for m in doc["measurements"]} == {"baseline", "adaptive", "eagle"}
    tokens = {m["contestant"]: m["token_ids"] for m in doc["measurements"]}
    assert tokens["eagle"] == tokens["baseline"] == tokens["adaptive"]
    summary = doc["summary"]["eagle"]
    assert len(summary["acceptance_by_position"]) == 3 and summary["tau_by_category"]
    from specgen.bench.runner import contestants, default_names

    names = default_names(contestants(), quantized=False, with_llama=False, head_kind="eagle")
    assert "eagle" in names and "medusa" not in names and "eagle3" not in names
    result = CliRunner().invoke(app, ["bench", "-p", str(head_profile()), "--contestants", "medusa"])
    assert result.exit_code == 2 and "has a eagle head" in result.output
