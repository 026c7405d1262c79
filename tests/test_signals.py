"""How the command line ends when told to: SIGTERM is handled like Ctrl-C (output so far kept,
the run recorded as interrupted, exit 143) in run, chat and bench; a closed stdout ends the
run quietly (exit 141) and records it. Real processes on the tiny fp32 profile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specgen.app.store import load_runs
from specgen.cli import app

SRC = str(Path(__file__).resolve().parents[1] / "src")


def env(tmp_path: Path) -> dict:
    out = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    out.update(PYTHONPATH=SRC, OMP_NUM_THREADS="1", SPECGEN_STATS_DB=str(tmp_path / "h.db"),
               SPECGEN_CACHE_DIR=str(tmp_path / "cache"),
               SPECGEN_HISTORY_FILE=str(tmp_path / "chat_history"))
    return out


def default_signals() -> None:
    """A shell running the suite in the background may start children with signals ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def specgen(*args: str, tmp_path: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specgen", *args], env=env(tmp_path),
                            preexec_fn=default_signals, **kwargs)


# --- in process -------------------------------------------------------------------------------

def test_sigterm_raises_terminated_while_a_command_runs_and_only_once():
    from specgen.cli import signals
    from specgen.errors import SpecgenWarning, Terminated

    before = signal.getsignal(signal.SIGTERM)
    shown = []
    with signals.handled(shown.append):
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs here
        os.kill(os.getpid(), signal.SIGTERM)  # a second one lets the cleanup finish
        time.sleep(0.05)
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a model's own code runs", SpecgenWarning)
    assert signal.getsignal(signal.SIGTERM) == before
    assert shown == ["a model's own code runs"]
    assert issubclass(Terminated, KeyboardInterrupt)  # every Ctrl-C path keeps its work
    assert signals.exit_code(Terminated()) == 143
    assert signals.exit_code(KeyboardInterrupt()) == 130
    assert signals.exit_code(BrokenPipeError()) == 141


@pytest.mark.parametrize("stop, code", [("Terminated", 143), ("KeyboardInterrupt", 130)])
def test_the_exit_code_says_what_ended_the_command(monkeypatch, tiny_profile, stop, code):
    from specgen import errors

    def load_session(prof, **options):
        raise getattr(errors, stop, KeyboardInterrupt)()

    monkeypatch.setattr("specgen.cli.run.load_session", load_session)
    result = CliRunner().invoke(app, ["run", "-p", str(tiny_profile), "hi"])
    assert result.exit_code == code
    assert "Traceback" not in result.output


# --- real processes ---------------------------------------------------------------------------

def test_sigterm_in_run_keeps_the_output_and_records_the_run(tiny_profile, tmp_path):
    proc = specgen("run", "-p", str(tiny_profile), "--raw", "-n", "3000", "--k", "2", "go",
                   tmp_path=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read(1)  # generation has started
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err.decode()
    assert first and len(first + rest) > 1
    assert b"interrupted" in err and b"Traceback" not in err
    (row,) = load_runs(tmp_path / "h.db")
    assert row["ended"] == "interrupted" and row["stop_reason"] == "interrupted"
    assert 0 < row["new_tokens"] < 3000


def test_a_closed_stdout_ends_the_run_quietly_and_records_it(tiny_profile, tmp_path):
    """`specgen run ... | head -c 1`: the reader leaves after the first bytes."""
    proc = specgen("run", "-p", str(tiny_profile), "--raw", "-n", "3000", "--k", "2", "go",
                   tmp_path=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(1)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err.decode()
    assert err.strip() == b"", err.decode()  # no traceback, no "Exception ignored"
    (row,) = load_runs(tmp_path / "h.db")
    assert row["ended"] == "interrupted" and 0 < row["new_tokens"] < 3000


def test_sigterm_in_chat_keeps_the_turn_and_ends_the_chat(tiny_profile, tmp_path):
    proc = specgen("chat", "-p", str(tiny_profile), "-n", "3000", "--k", "2", tmp_path=tmp_path,
                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(b"tell me everything\nand more\n")
    proc.stdin.flush()
    first = proc.stdout.read(1)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err.decode()
    assert first and b"Traceback" not in err
    rows = load_runs(tmp_path / "h.db")
    assert rows and {r["command"] for r in rows} == {"chat"}
    assert rows[-1]["ended"] == "interrupted"


def test_sigterm_in_bench_keeps_the_figures_so_far(tiny_profile, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"category": c, "prompt": p}) for c, p in (
        ("code", "def add(a, b):"), ("prose", "Once upon a time"), ("prose", "abc abc"))))
    out = tmp_path / "bench.json"
    proc = specgen("bench", "-p", str(tiny_profile), "--prompts", str(prompts), "-n", "400",
                   "--contestants", "baseline,k2", "--repeats", "3", "--out", str(out),
                   tmp_path=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = b""
    while b"[1/" not in seen:  # the first measurement is in
        line = proc.stderr.readline()
        assert line, proc.communicate()
        seen += line
    proc.send_signal(signal.SIGTERM)
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, (seen + err).decode()
    assert b"interrupted" in err and b"Traceback" not in err
    doc = json.loads(out.read_text())
    assert doc["config"]["complete"] is False and doc["measurements"]
    assert b"summary" in stdout
    assert load_runs(tmp_path / "h.db") == []  # bench measurements stay out of the history


def test_a_command_that_is_done_leaves_without_the_interpreters_teardown(tmp_path):
    """The console entry point: the output whole, the atexit handlers run, the exit code the
    command's (0, and 2 for an error), and no teardown (an object's finalizer never runs)."""
    code = ("import atexit, sys\n"
            "from specgen.cli import main\n"
            "atexit.register(lambda: print('atexit ran', file=sys.stderr))\n"
            "class Late:\n"
            "    def __del__(self):\n"
            "        print('torn down', file=sys.stderr)\n"
            "late = Late()\n"
            "sys.argv = ['specgen', *sys.argv[1:]]\n"
            "main()\n")
    listed = CliRunner().invoke(app, ["profiles", "list"])
    assert listed.exit_code == 0 and listed.stdout
    for args, status, stdout in ((["profiles", "list"], 0, listed.stdout),
                                 (["run", "-p", "no-such-profile", "hi"], 2, "")):
        done = subprocess.run([sys.executable, "-c", code, *args], env=env(tmp_path),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == status, done.stderr[-2000:]
        assert done.stdout == stdout
        assert done.stderr.splitlines()[-1] == "atexit ran" and "torn down" not in done.stderr
    assert done.stderr.count("error:") == 1


def test_a_profiled_command_ends_the_usual_way_so_that_the_profile_is_written(tmp_path):
    stats = tmp_path / "run.prof"
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(stats), "-m", "specgen",
                           "profiles", "list"], env=env(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert stats.stat().st_size > 0
