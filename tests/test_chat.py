"""`specgen chat` on a tiny fp32 profile: the conversation logic in process (prefix reuse,
interrupts, trimming, commands, transcripts), a pipe through CliRunner, and the REPL as a
real process in a pseudo-terminal."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import pty
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specgen.commands.chat import (Chat, line_editing, parse_command, read_message,
                          unescape)
from specgen.cli import app
from specgen.errors import SpecgenError
from specgen.paths import chat_history
from specgen.profiles import load_profile
from specgen.app.session import open_session
from specgen.app.store import load_runs

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(autouse=True)
def isolated_history(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "history.sqlite3"))
    monkeypatch.setenv("SPECGEN_HISTORY_FILE", str(tmp_path / "chat_history"))


@pytest.fixture
def chat(tiny_profile) -> Chat:
    return Chat(open_session(load_profile(str(tiny_profile))))


def say(chat: Chat, message: str) -> list[int]:
    return [t.id for t in chat.answer(chat.prepare(message))]


def target_greedy(chat: Chat, ids: torch.Tensor, n: int) -> list[int]:
    target = chat.session.pair.target
    out = target.generate(ids[None], do_sample=False, max_new_tokens=n, eos_token_id=258)
    return out[0, len(ids):].tolist()


# --- pure pieces ----------------------------------------------------------------------------


def test_parse_command():
    assert parse_command("/k 2") == ("k", "2")
    assert parse_command("  /SAVE  notes.md ") == ("save", "notes.md")
    assert parse_command("/system be brief, please") == ("system", "be brief, please")
    assert parse_command("/exit") == ("exit", "")
    assert parse_command("hello /k 2") is None
    assert parse_command("//usr/bin is what?") is None
    assert unescape("//usr/bin is what?") == "/usr/bin is what?"
    assert unescape("plain") == "plain"


def test_read_message_single_lines_and_triple_quoted_blocks():
    def reader(*lines):
        it = iter(lines)

        def read_line(prompt):
            try:
                return next(it)
            except StopIteration:
                raise EOFError from None
        return read_line

    assert read_message(reader("hello")) == "hello"
    block = reader('"""', "def f():", "    return 1", '"""')
    assert read_message(block) == "def f():\n    return 1"
    assert read_message(reader('"""first', "second", 'third"""')) == "first\nsecond\nthird"
    assert read_message(reader('"""one line"""')) == "one line"
    with pytest.raises(EOFError):
        read_message(reader('"""', "unterminated"))


def test_history_file_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECGEN_HISTORY_FILE", str(tmp_path / "h"))
    assert chat_history() == tmp_path / "h"
    monkeypatch.delenv("SPECGEN_HISTORY_FILE")
    assert chat_history().name == "chat_history" and "specgen" in str(chat_history())


def test_line_editing_works_without_readline(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "readline", None)  # import readline raises ImportError
    with line_editing(tmp_path / "h"):
        pass
    assert not (tmp_path / "h").exists()


# --- the conversation -------------------------------------------------------------------------


def test_turn_two_prefills_only_its_new_tokens_and_stays_exact(chat):
    out1 = say(chat, "hello there")
    first = chat.last
    assert first.ended == "completed" and len(out1) > 0
    context = len(chat._ids)

    pending = chat.prepare("and a second question")
    assert torch.equal(pending.ids[:context], chat._ids)  # the context, token for token
    out2 = [t.id for t in chat.answer(pending)]
    stats = chat.last.stats
    new = len(pending.ids) - context  # template glue + the new user message
    assert stats.prompt_tokens == len(pending.ids) > context > 30
    assert stats.prefill_tokens <= new + 1  # the last answer's last token and the new turn only
    assert out2 == target_greedy(chat, pending.ids, len(out2))  # reuse changed nothing


def test_ctrl_c_outside_the_engines_frame_still_ends_the_turn_interrupted(chat, monkeypatch):
    """Ctrl-C can arrive in code between the engine's generator and its consumer (torch's
    inference-mode wrapper): the engine's stats still say "running" then."""
    real = chat.session.generator.stream

    def interrupted_stream(*args, **kwargs):
        inner = real(*args, **kwargs)
        for i, token in enumerate(inner):
            if i == 3:
                raise KeyboardInterrupt  # the engine's own frame never sees it
            yield token

    monkeypatch.setattr(chat.session.generator, "stream", interrupted_stream)
    with pytest.raises(KeyboardInterrupt):
        say(chat, "tell me a long story")
    turn = chat.last
    assert turn.ended == "interrupted" and turn.stats.stop_reason == "interrupted"
    assert chat.turns == [turn]


def test_ctrl_c_between_tokens_keeps_the_partial_answer(chat):
    answer = chat.answer(chat.prepare("tell me a long story"))
    partial = [next(answer).id for _ in range(3)]
    answer.close()  # what the REPL does on Ctrl-C
    turn = chat.last
    assert turn.ended == "interrupted" and turn.stats.stop_reason == "interrupted"
    assert chat.turns == [turn] and turn.stats.new_tokens >= 3
    assert chat._ids[-3:].tolist() == partial

    pending = chat.prepare("go on")
    out = [t.id for t in chat.answer(pending)]
    assert chat.last.ended == "completed"
    assert out == target_greedy(chat, pending.ids, len(out))


def test_ctrl_c_inside_a_forward_resets_the_caches_and_the_next_turn_reprefills(chat, monkeypatch):
    say(chat, "hello")
    target = chat.session.pair.target
    norm = target.base_model.norm  # the last op of every target pass, whichever decoder runs it
    real_forward, calls = norm.forward, []

    def interrupted_forward(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(norm, "forward", interrupted_forward)
    with pytest.raises(KeyboardInterrupt):
        say(chat, "a second one")
    assert chat.last.ended == "interrupted" and len(calls) == 3
    monkeypatch.setattr(norm, "forward", real_forward)

    pending = chat.prepare("and a third")
    out = [t.id for t in chat.answer(pending)]
    assert chat.last.stats.prefill_tokens == len(pending.ids)  # caches were reset
    assert out == target_greedy(chat, pending.ids, len(out))


def test_a_long_conversation_drops_its_oldest_turns(chat):
    chat.context_limit = 200  # budget: 200 - 24 new tokens
    dropped = []
    for i in range(5):
        pending = chat.prepare(f"message number {i}: " + "x" * 30)
        dropped.append(pending.dropped)
        assert len(pending.ids) <= 200 - 24
        list(chat.answer(pending))
    assert sum(dropped) > 0 and dropped[0] == 0
    assert len(chat.turns) == 5  # the transcript keeps everything...
    users = [m["content"] for m in chat.messages("next") if m["role"] == "user"]
    assert "message number 0" not in " ".join(users)  # ...the context does not
    assert users[-2].startswith("message number 4")


def test_a_message_longer_than_the_context_is_refused_without_a_turn(chat):
    say(chat, "hi")
    with pytest.raises(SpecgenError, match="context"):
        say(chat, "y" * 5000)
    assert len(chat.turns) == 1 and chat.messages("z")[0]["content"] == "hi"  # nothing dropped


# --- commands and transcripts -------------------------------------------------------------


def text_of(reply) -> str:
    return "\n".join(str(line) for line in reply.lines)


def test_commands_change_the_settings(chat):
    gen = chat.session.generator
    assert text_of(chat.command("k", "2")) == "K = 2, the most per step (adaptive)."
    assert gen.k_max == 2 and chat.session.profile.speculation.num_speculative_tokens == 2
    assert "off" in text_of(chat.command("adaptive", "off")) and gen.adaptive is False
    assert text_of(chat.command("tree", "off")) == "Token trees off."
    assert gen.tree is False and chat.session.profile.speculation.tree is False
    chat.command("temperature", "0.5")
    assert chat.session.sampling_kwargs()["temperature"] == 0.5
    chat.command("system", "be brief")
    assert chat.messages("q")[0] == {"role": "system", "content": "be brief"}
    say(chat, "hi")
    assert chat.last.stats.k_max == 2 and chat.last.stats.adaptive is False
    chat.command("reset", "")
    assert chat.turns == [] and chat.messages("q")[0]["role"] == "system"
    chat.command("system", "")
    assert chat.messages("q") == [{"role": "user", "content": "q"}]
    assert chat.command("exit", "").exit and chat.command("quit", "").exit
    help_text = text_of(chat.command("help", ""))
    for usage in ("/reset", "/system TEXT", "/k N", "/adaptive on|off", "/tree on|off", "/temperature X",
                  "/stats", "/save FILE", "/exit", '"""'):
        assert usage in help_text


@pytest.mark.parametrize("name, arg, message", [
    ("k", "two", "/k needs a whole number"),
    ("k", "-1", "num_speculative_tokens must be from 0 to 32"),
    ("k", "64", "num_speculative_tokens must be from 0 to 32"),
    ("adaptive", "maybe", "on or off"),
    ("tree", "yes", "/tree takes on or off"),
    ("temperature", "-1", "temperature must be >= 0"),
    ("temperature", "hot", "needs a number"),
    ("save", "", "needs a file name"),
    ("save", "chat.txt", ".md"),
    ("kk", "", "Unknown command /kk. Did you mean /k?"),
])
def test_bad_commands_get_a_hint_not_a_crash(chat, name, arg, message):
    reply = chat.command(name, arg)
    assert reply.error and message in text_of(reply) and not reply.exit


def test_stats_and_transcripts(chat, tmp_path):
    assert text_of(chat.command("stats", "")) == "No answers yet."
    chat.command("system", "be brief")
    say(chat, "first question")
    say(chat, "second question")
    stats = text_of(chat.command("stats", ""))
    tokens = sum(s.new_tokens for s in chat.history)
    assert stats.startswith(f"2 answers · {tokens} tokens · acceptance")
    assert "tau" in stats and "tok/s" in stats and "Acceptance by draft position" in stats

    assert "Saved 2 turns" in text_of(chat.command("save", str(tmp_path / "t.json")))
    data = json.loads((tmp_path / "t.json").read_text(encoding="utf-8"))
    assert data["system"] == "be brief" and data["profile"] == "tiny"
    assert [t["user"] for t in data["turns"]] == ["first question", "second question"]
    assert data["turns"][1]["assistant"] == chat.turns[1].answer
    assert data["turns"][0]["stats"]["new_tokens"] == chat.turns[0].stats.new_tokens

    chat.command("save", str(tmp_path / "t.md"))
    md = (tmp_path / "t.md").read_text(encoding="utf-8")
    assert md.startswith("# specgen chat · tiny")
    assert md.index("## System") < md.index("first question") < md.index("second question")
    assert md.count("## User") == 2 and md.count("## Assistant") == 2


# --- the command line -------------------------------------------------------------------------


def test_piped_stdin_reads_turns_line_by_line(tiny_profile, tmp_path):
    result = CliRunner().invoke(
        app, ["chat", "-p", str(tiny_profile), "--record-prompt"],
        input='hello\n/k 2\n"""\ntwo\nlines\n"""\n/bogus\n',
    )
    assert result.exit_code == 0, result.output
    assert "K = 2" in result.stderr and "Unknown command /bogus" in result.stderr
    assert ">>>" not in result.output and "K = 2" not in result.stdout  # answers only
    rows = load_runs(tmp_path / "history.sqlite3")
    assert [r["command"] for r in rows] == ["chat", "chat"]
    assert [r["prompt"] for r in rows] == ["hello", "two\nlines"]
    assert [r["k_max"] for r in rows] == [3, 2]
    assert rows[1]["prefill_tokens"] < rows[1]["prompt_tokens"] // 2


def subprocess_env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(PYTHONPATH=SRC, OMP_NUM_THREADS="1", TERM="xterm-256color", COLUMNS="100",
               SPECGEN_STATS_DB=str(tmp_path / "h.db"),
               SPECGEN_HISTORY_FILE=str(tmp_path / "chat_history"))
    return env


class Terminal:
    """A child process on a pseudo-terminal that is its controlling terminal, so that
    Ctrl-C and Ctrl-D typed into it act as they do for a user."""

    def __init__(self, args: list[str], env: dict) -> None:
        self.master, slave = pty.openpty()

        def take_terminal():
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            # a suite run from a background job would hand SIGINT down ignored
            signal.signal(signal.SIGINT, signal.SIG_DFL)

        self.proc = subprocess.Popen([sys.executable, "-m", "specgen", *args], stdin=slave,
                                     stdout=slave, stderr=slave, env=env, preexec_fn=take_terminal)
        os.close(slave)
        self.out, self.mark = "", 0

    def expect(self, text: str, timeout: float = 120) -> str:
        """Read until `text` appears after the last match; return what came in between."""
        deadline = time.time() + timeout
        while text not in self.out[self.mark:]:
            if time.time() > deadline or not self._read(deadline - time.time()):
                raise AssertionError(f"{text!r} did not appear; output so far:\n{self.out}")
        end = self.out.index(text, self.mark) + len(text)
        seen, self.mark = self.out[self.mark:end], end
        return seen

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], min(timeout, 1.0))
        if ready:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                return False
            self.out += chunk.decode("utf-8", "replace")
            return bool(chunk)
        return self.proc.poll() is None

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> int:
        while self._read(1.0):
            pass
        os.close(self.master)
        return self.proc.wait(timeout=30)


def test_terminal_session(tiny_profile, tmp_path):
    term = Terminal(["chat", "-p", str(tiny_profile)], subprocess_env(tmp_path))
    term.expect("Ctrl-D leaves")
    assert "accepted" in term.expect(">>> ")  # the colour legend
    term.type("hello there\n")
    first = term.expect(">>> ")
    assert "\x1b[3" in first and "tokens in" in first  # coloured answer, then the summary
    term.type("what next?\n")
    term.expect("tokens in")
    term.expect(">>> ")
    term.type("/stats\n")
    term.expect("2 answers ·")
    assert "Acceptance by draft position" in term.expect(">>> ")
    term.type("/k 2\n")
    term.expect("K = 2, the most per step")
    term.type("/nope\n")
    term.expect("Unknown command /nope")
    term.type("/exit\n")
    assert term.close() == 0
    assert "Traceback" not in term.out
    rows = load_runs(tmp_path / "h.db")
    assert [(r["command"], r["ended"]) for r in rows] == [("chat", "completed")] * 2
    assert rows[1]["prefill_tokens"] < rows[1]["prompt_tokens"] // 2
    history = (tmp_path / "chat_history").read_text()
    assert "hello there" in history and "/k 2" in history  # input history persists


def test_terminal_ctrl_c_stops_the_answer_and_ctrl_d_leaves(tiny_profile, tmp_path):
    term = Terminal(["chat", "-p", str(tiny_profile), "--max-new-tokens", "3000", "--k", "2"],
                    subprocess_env(tmp_path))
    term.expect(">>> ")
    for message in ("go", "again"):
        term.type(message + "\n")
        term.expect("\x1b[3")  # the answer has started
        time.sleep(0.3)
        term.type("\x03")
        assert "interrupted" in term.expect(">>> ")
    term.type("\x04")
    assert term.close() == 0
    assert "Traceback" not in term.out
    rows = load_runs(tmp_path / "h.db")
    assert [r["ended"] for r in rows] == ["interrupted"] * 2
    assert all(0 < r["new_tokens"] < 3000 for r in rows)
