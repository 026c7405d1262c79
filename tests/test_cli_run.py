"""`specgen run` end to end on a tiny fp32 profile: through CliRunner and as a real process
in a pipe and in a pseudo-terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specgen.cli import app

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(autouse=True)
def isolated_history(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "history.sqlite3"))
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))


def invoke(*args, input=None):
    return CliRunner().invoke(app, ["run", *args], input=input)


def run_json(profile, *args, input=None) -> dict:
    result = invoke("-p", str(profile), "--format", "json", *args, input=input)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_schema_and_text_is_joined_tokens(tiny_profile):
    answer = run_json(tiny_profile, "hello there")
    assert set(answer) == {"text", "tokens", "stats", "profile", "target", "draft"}
    assert answer["text"] == "".join(t["text"] for t in answer["tokens"])
    assert all(set(t) == {"id", "text", "source"} for t in answer["tokens"])
    assert {t["source"] for t in answer["tokens"]} <= {"accepted", "resampled", "bonus"}
    stats = answer["stats"]
    assert stats["new_tokens"] == len(answer["tokens"]) <= 24
    for key in ("target_passes", "draft_passes", "proposed", "accepted", "acceptance_rate", "tau",
                "per_position_accepted", "accepted_length_hist", "k_per_step", "tokens_per_second"):
        assert key in stats
    assert answer["profile"] == "tiny" and answer["target"].endswith("target")


def test_greedy_output_equals_the_targets_own_greedy_output(tiny_profile, chat_greedy):
    answer = run_json(tiny_profile, "--max-new-tokens", "40", "--k", "4", "def quicksort(xs):")
    expected = chat_greedy(tiny_profile.parent / "target", "def quicksort(xs):", 40)
    assert [t["id"] for t in answer["tokens"]] == expected


def test_the_garbage_collector_is_paused_while_the_models_load(tiny_profile, monkeypatch):
    """Importing torch and loading the models make many objects, none garbage: `run` pauses
    the collector for them, and it runs again (what was loaded frozen out of its scans) once
    they are loaded, and also when loading fails."""
    import gc

    from specgen.app import session
    from specgen.errors import ModelError

    seen, real = [], session.open_session

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)
    monkeypatch.setattr(session, "open_session", spy)
    run_json(tiny_profile, "hello there")
    assert seen == [False] and gc.isenabled() and gc.get_freeze_count() > 0

    def fail(*a, **k):
        raise ModelError("no such model")
    monkeypatch.setattr(session, "open_session", fail)
    gc.unfreeze()
    result = invoke("-p", str(tiny_profile), "hello there")
    assert result.exit_code == 2 and gc.isenabled()


def test_raw_skips_the_chat_template(tiny_profile):
    templated = run_json(tiny_profile, "abc")
    raw = run_json(tiny_profile, "--raw", "abc")
    assert raw["stats"]["prompt_tokens"] == 3
    assert templated["stats"]["prompt_tokens"] > 3


def test_prompt_from_stdin_and_from_file(tiny_profile, tmp_path):
    from_arg = run_json(tiny_profile, "--raw", "same prompt")
    from_stdin = run_json(tiny_profile, "--raw", "-", input="same prompt")
    file = tmp_path / "prompt.txt"
    file.write_text("same prompt")
    from_file = run_json(tiny_profile, "--raw", "--file", str(file))
    assert from_arg["text"] == from_stdin["text"] == from_file["text"]  # sources vary with adaptive K


def test_seeded_sampling_is_reproducible(tiny_profile):
    args = ("--temperature", "0.9", "--top-p", "0.9", "--seed", "7", "--no-adaptive", "hi")
    assert run_json(tiny_profile, *args)["tokens"] == run_json(tiny_profile, *args)["tokens"]


def test_the_run_is_recorded_in_the_history(tiny_profile, tmp_path):
    from specgen.app.store import load_runs

    answer = run_json(tiny_profile, "hello")
    (row,) = load_runs(tmp_path / "history.sqlite3")
    assert row["command"] == "run" and row["profile"] == "tiny" and row["ended"] == "completed"
    assert row["new_tokens"] == answer["stats"]["new_tokens"]
    assert row["accepted"] == answer["stats"]["accepted"] and row["prompt"] is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["-p", "no-such-profile", "x"], "No profile named 'no-such-profile'"),
        (["--temperature", "-1", "x"], "temperature must be >= 0"),
        (["--k", "-2", "x"], "num_speculative_tokens must be from 0 to 32"),
        (["--k", "40", "x"], "num_speculative_tokens must be from 0 to 32"),
        (["--top-p", "1.5", "x"], "top_p"),
        (["--format", "xml", "x"], "--format must be"),
        (["--file", "/no/such/file.txt"], "Cannot read the prompt file"),
        (["   "], "prompt is empty"),
    ],
)
def test_errors_are_one_clear_line(tiny_profile, args, message):
    if args[0] != "-p":
        args = ["-p", str(tiny_profile), *args]
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert result.stderr.strip().startswith("error:")


def subprocess_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(PYTHONPATH=SRC, OMP_NUM_THREADS="1", TERM="xterm-256color", **extra)
    return env


def test_pipe_gets_plain_text_and_summary_on_stderr(tiny_profile, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "specgen", "run", "-p", str(tiny_profile), "hi"],
        capture_output=True, text=True, timeout=300,
        env=subprocess_env(SPECGEN_STATS_DB=str(tmp_path / "h.db")),
    )
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout
    assert "tokens in" in proc.stderr and "tokens in" not in proc.stdout


def default_sigint() -> None:
    """A shell running the suite in the background starts children with SIGINT ignored, and
    Python then never raises KeyboardInterrupt: give the child the default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def read_pty(cmd, env, timeout=300) -> tuple[int, str]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env,
                            preexec_fn=default_sigint)
    os.close(slave)
    out = b""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=30), out.decode("utf-8", "replace")


def test_terminal_gets_colours_and_legend(tiny_profile, tmp_path):
    env = subprocess_env(SPECGEN_STATS_DB=str(tmp_path / "h.db"))
    cmd = [sys.executable, "-m", "specgen", "run", "-p", str(tiny_profile), "hi"]
    rc, out = read_pty(cmd, env)
    assert rc == 0, out
    assert "\x1b[" in out and "accepted" in out and "resampled" in out and "bonus" in out
    rc, plain = read_pty(cmd + ["--no-color"], env)
    assert rc == 0 and "\x1b[3" not in plain  # no colour codes (cursor control may remain)
    rc, plain = read_pty(cmd, {**env, "NO_COLOR": "1"})
    assert rc == 0 and "\x1b[3" not in plain


def test_ctrl_c_keeps_partial_output_and_exits_130(tiny_profile, tmp_path):
    from specgen.app.store import load_runs

    db = tmp_path / "h.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "specgen", "run", "-p", str(tiny_profile), "--raw",
         "--max-new-tokens", "3000", "--k", "2", "go"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env(SPECGEN_STATS_DB=str(db)),
        preexec_fn=default_sigint,
    )
    first = proc.stdout.read(1)  # generation has started
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err.decode()
    assert first and len(first + rest) > 1
    assert b"interrupted" in err and b"Traceback" not in err
    (row,) = load_runs(db)
    assert row["ended"] == "interrupted" and 0 < row["new_tokens"] < 3000


def test_no_tree_keeps_chains(tiny_profile, monkeypatch):
    """--no-tree reaches the generator: with every branch worth its row, the run builds
    token trees by default and none with the flag; the answer is the same."""
    from specgen.choices import MAX_TREE_ROWS
    from specgen.core import tree as trees
    from specgen.core.adaptive import Planner

    def every_branch(self, scores, tokens, k):
        chosen = trees.choose_branches(scores, tokens, 0.0, MAX_TREE_ROWS - 1 - k)
        self.branch_offer = sum(score for _, _, score in chosen)
        return [(index, token) for index, token, _ in chosen]

    monkeypatch.setattr(Planner, "branches", every_branch)
    args = ("--method", "draft-model", "--raw", "-n", "24", "the cat sat")
    trees_on, chains = run_json(tiny_profile, *args), run_json(tiny_profile, "--no-tree", *args)
    assert trees_on["stats"]["tree_steps"] > 0 and chains["stats"]["tree_steps"] == 0
    assert [t["id"] for t in trees_on["tokens"]] == [t["id"] for t in chains["tokens"]]


def test_the_summary_line_counts_tree_steps():
    from specgen.app.render import summary_line
    from specgen.core.stats import Stats

    trees = Stats(k_max=4, adaptive=True, new_tokens=12, target_passes=5, tree_steps=3,
                  branch_kept=1)
    assert "5 target passes · 3 as trees, 1 kept a branch · est." in summary_line(trees)
    assert "as trees" not in summary_line(Stats(k_max=4, adaptive=True, new_tokens=12))
