"""`specgen heads train` on a tiny profile: it writes a head that a profile loads, resumes from
its checkpoint (also after Ctrl-C), and refuses bad requests in one line. And the unrolled
training's attention mask."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specgen.cli import app
from specgen.heads import train as t

CORPUS = {
    "alpha.py": "def add(a, b):\n    return a + b\n\n" * 40,
    "beta.md": "# Notes\n\nThe quick brown fox jumps over the lazy dog.\n" * 30,
    "tests/test_skipped.py": "assert True\n" * 200,
}


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    for name, text in CORPUS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def train(profile, corpus, out, *extra):
    return CliRunner().invoke(app, ["heads", "train", "-p", str(profile), "--corpus", str(corpus),
                                    "--out", str(out), "--seq-len", "160", "--batch", "2",
                                    "--minutes", "5", *extra])


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_train_writes_a_head_that_a_profile_drafts_with_and_resumes(tiny_profile, corpus, tmp_path,
                                                                     kind, monkeypatch):
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "history.sqlite3"))
    out = tmp_path / "head"
    result = train(tiny_profile, corpus, out, "--kind", kind, "--steps", "20")
    assert result.exit_code == 0, result.output
    state = json.loads((out / "state.json").read_text())
    assert state["steps"] == 20 and len(state["agreement"]) == (2 if kind == "eagle" else 4)
    config = json.loads((out / "config.json").read_text())
    assert config["specgen"]["steps"] == 20 and config["specgen"]["corpus_files"] == 2
    # the same command resumes where it stopped
    result = train(tiny_profile, corpus, out, "--kind", kind, "--steps", "5")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "state.json").read_text())["steps"] == 25
    profile = tmp_path / "with-head.toml"
    profile.write_text(f'extends = "{tiny_profile}"\n[draft]\nhead = "{out}"\nkind = "{kind}"\n'
                       f'[speculation]\nmethod = "{kind}"\n')
    result = CliRunner().invoke(app, ["run", "-p", str(profile), "--format", "json", "-n", "10",
                                      "def add(a, b):"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stats"]["new_tokens"] == 10


def test_ctrl_c_keeps_a_checkpoint_and_the_next_run_resumes(tiny_profile, corpus, tmp_path,
                                                            monkeypatch):
    out = tmp_path / "head"
    step = t.Trainer.train_step

    def interrupted(self, progress=0.0):
        if self.state.steps == 7:
            raise KeyboardInterrupt
        step(self, progress)

    monkeypatch.setattr(t.Trainer, "train_step", interrupted)
    result = train(tiny_profile, corpus, out, "--kind", "eagle")
    assert result.exit_code == 130 and "resume" in result.output
    saved = json.loads((out / "state.json").read_text())
    assert saved["steps"] == 7 and (out / "model.safetensors").is_file()
    monkeypatch.setattr(t.Trainer, "train_step", step)
    result = train(tiny_profile, corpus, out, "--kind", "eagle", "--steps", "3")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "state.json").read_text())["steps"] == 10
    # a checkpoint whose head is not the one this run builds is refused, not half restored
    saved = torch.load(out / "trainer.pt", weights_only=True)
    del saved["head"]["fc.weight"]
    torch.save(saved, out / "trainer.pt")
    result = train(tiny_profile, corpus, out, "--kind", "eagle", "--steps", "1")
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "other shapes than this run builds" in said, said


@pytest.mark.parametrize("args, message", [
    (["--kind", "eagle3"], "not 'eagle3'"),
    (["--minutes", "0"], "--minutes must be > 0"),
])
def test_bad_requests_are_one_line(tiny_profile, corpus, tmp_path, args, message):
    result = train(tiny_profile, corpus, tmp_path / "h", *args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_folder_that_is_not_a_run_or_a_tiny_corpus_is_refused(tiny_profile, corpus, tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    result = train(tiny_profile, corpus, busy, "--kind", "eagle")
    assert result.exit_code == 2 and "holds no training run" in result.output
    small = tmp_path / "small"
    small.mkdir()
    (small / "a.py").write_text("x = 1\n" * 60)
    result = train(tiny_profile, small, tmp_path / "h2", "--kind", "eagle")
    assert result.exit_code == 2 and "corpus is too small" in result.output
    result = train(tiny_profile, tmp_path / "nowhere", tmp_path / "h3", "--kind", "eagle")
    assert result.exit_code == 2 and "is not a folder" in result.output


def test_the_chain_mask_puts_each_step_where_drafting_does():
    """Step 3 at position 5 reads the true pairs up to 3, its chain's step-2 key at 4 and
    its own key at 5; nothing else."""
    mask = t._chain_mask(8, 3, "cpu")
    row = mask[5].view(3, 8)
    assert row[0].nonzero().flatten().tolist() == [0, 1, 2, 3]
    assert row[1].nonzero().flatten().tolist() == [4]
    assert row[2].nonzero().flatten().tolist() == [5]
    assert torch.equal(t._chain_mask(4, 1, "cpu"), torch.ones(4, 4, dtype=torch.bool).tril())
