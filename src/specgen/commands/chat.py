"""`specgen chat`: a multi-turn conversation on one loaded model pair.

The context is kept as the token ids the models saw: a new turn appends the chat template's
glue and the new user message to the last prompt and answer, so the engine's prefix reuse
prefills only those new tokens (re-tokenizing the decoded answer would not give back the
same ids in general). When the rendered conversation no longer extends the last one (a new
system prompt, dropped turns, a template that rewrites past answers), it is encoded afresh
and the engine reuses whatever common prefix remains.

`Chat` holds the conversation and the slash commands and does no terminal I/O; `repl` is
the edge that reads lines and prints; `run` is the command's flow (load, greet, repl).
"""

from __future__ import annotations

import difflib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console, RenderableType
from rich.markup import escape
from torch import Tensor

from specgen.app.render import IncrementalDecoder, TokenPrinter, err, make_console, summary_line
from specgen.app.report import pct, profile_charts, summarize
from specgen.app.session import Session
from specgen.app.store import record_run
from specgen.core.stats import Stats, Token
from specgen.errors import ConfigError, SpecgenError, Terminated
from specgen.loading.load import context_limit
from specgen.paths import chat_history
from specgen.profiles import Profile, utf8_text, with_overrides

PROMPT, MORE = ">>> ", "... "
FENCE = '"""'
COMMANDS = {  # name: (usage, what it does)
    "help": ("/help", "this list"),
    "reset": ("/reset", "start a new conversation"),
    "system": ("/system TEXT", "set the system prompt (no TEXT clears it)"),
    "k": ("/k N", "draft N tokens per step (the most, when adaptive); 0 is plain decoding"),
    "adaptive": ("/adaptive on|off", "let K follow the acceptance rate, or keep it fixed"),
    "tree": ("/tree on|off", "let the draft's chain branch to its next guesses, or keep chains"),
    "temperature": ("/temperature X", "sampling temperature; 0 is greedy"),
    "stats": ("/stats", "acceptance, tau and speed of this session so far"),
    "save": ("/save FILE", "the transcript as Markdown (.md) or JSON (.json)"),
    "exit": ("/exit", "leave (Ctrl-D too)"),
}


@dataclass
class Turn:
    user: str
    answer: str
    ended: str  # "completed" | "interrupted"
    stats: Stats


@dataclass
class Pending:
    """A user message ready to answer: the prompt ids and text, and how many of the oldest
    turns had to leave the context to make room."""

    user: str
    ids: Tensor
    text: str
    first: int  # the oldest turn kept in the context
    dropped: int = 0


@dataclass
class Reply:
    """What a slash command has to say; `exit` ends the chat."""

    lines: list[RenderableType] = field(default_factory=list)
    exit: bool = False
    error: bool = False


def parse_command(line: str) -> tuple[str, str] | None:
    """('k', '2') for '/k 2'; None for a message ('//x' is the message '/x')."""
    line = line.strip()
    if not line.startswith("/") or line.startswith("//"):
        return None
    name, _, arg = line[1:].partition(" ")
    return name.lower(), arg.strip()


def _on_off(arg: str, command: str) -> bool:
    if arg.lower() not in ("on", "off"):
        raise ConfigError(f"{command} takes on or off, got {arg!r}.")
    return arg.lower() == "on"


def _argument(parse: Callable[[str], Any], arg: str, command: str, want: str, example: str) -> Any:
    """A slash command's argument read by `parse`, or one line saying what it needs."""
    try:
        return parse(arg)
    except ValueError:
        raise ConfigError(f"{command} needs {want}, got {arg!r}: try {command} {example}.") from None


def unescape(message: str) -> str:
    stripped = message.lstrip()
    return stripped[1:] if stripped.startswith("//") else message


def read_message(read_line: Callable[[str], str]) -> str:
    """One message: a line, or the lines between two lines of triple quotes (for pasting
    code). `read_line(prompt)` raises EOFError at the end of input."""
    line = read_line(PROMPT)
    head = line.lstrip()
    if not head.startswith(FENCE):
        return line
    head = head[len(FENCE):]
    if head.rstrip().endswith(FENCE):  # """all on one line"""
        return head.rstrip()[: -len(FENCE)]
    lines = [head] if head.strip() else []
    while True:
        line = read_line(MORE)
        if line.rstrip().endswith(FENCE):
            last = line.rstrip()[: -len(FENCE)]
            return "\n".join(lines + ([last] if last.strip() else []))
        lines.append(line)


class Chat:
    """A conversation on a Session: turns, context ids, slash commands, transcript."""

    def __init__(
        self, session: Session, system: str | None = None, seed: int | None = None
    ) -> None:
        tokenizer = session.tokenizer
        if not session.profile.generation.chat_template:
            raise ConfigError(
                f"Profile {session.profile.name!r} sets chat_template = false, but chat needs "
                "the chat template. Use `specgen run --raw` for plain continuation."
            )
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"The tokenizer of {session.pair.target_name} has no chat template, so turns "
                "cannot be formatted. Use a chat (instruct) model, or `specgen run --raw` for "
                "plain continuation."
            )
        self.session = session
        self.system = system
        self.seed = seed
        self.turns: list[Turn] = []  # the transcript since the last /reset
        self.first = 0  # turns[first:] are in the context; older ones were dropped
        self.history: list[Stats] = []  # every answer of this session, for /stats
        self.last: Turn | None = None
        self._ids: Tensor | None = None  # the context: last prompt + answer, as the models saw it
        self._text = ""  # ... and as text
        limits = [context_limit(m) for m in (session.pair.target, session.pair.draft) if m is not None]
        self.context_limit: int = min([n for n in limits if n] or [1 << 30])

    # --- turns ----------------------------------------------------------------------------

    def messages(self, user: str, first: int | None = None) -> list[dict[str, str]]:
        """The context for answering `user`: the system prompt and turns[first:]."""
        messages = [{"role": "system", "content": self.system}] if self.system else []
        for turn in self.turns[self.first if first is None else first:]:
            messages += [{"role": "user", "content": turn.user},
                         {"role": "assistant", "content": turn.answer}]
        return messages + [{"role": "user", "content": user}]

    def prepare(self, user: str) -> Pending:
        """The prompt for `user`'s message, dropping the oldest turns while the prompt and a
        full answer (max_new_tokens) would not fit the context. The turns leave only once
        the answer has started: a message that is refused changes nothing."""
        user = utf8_text(user, "The message")
        budget = self.context_limit - self.session.profile.generation.max_new_tokens
        first = self.first
        while True:
            text = self.session.tokenizer.apply_chat_template(
                self.messages(user, first), add_generation_prompt=True, tokenize=False)
            ids = self._extend(text)  # once turns are dropped, this encodes afresh
            if len(ids) <= budget or first == len(self.turns):
                return Pending(user, ids, text, first, first - self.first)
            first += 1

    def _extend(self, text: str) -> Tensor:
        if self._ids is not None and text.startswith(self._text):
            return torch.cat([self._ids, self._encode(text[len(self._text):])])
        return self._encode(text)

    def _encode(self, text: str) -> Tensor:
        ids = self.session.tokenizer(text, add_special_tokens=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def answer(self, pending: Pending) -> Iterator[Token]:
        """Stream the answer. Closing this generator (Ctrl-C) keeps the partial answer as
        an interrupted turn; a SpecgenError (e.g. a message longer than the context) adds
        no turn."""
        generator = self.session.generator
        seed = None if self.seed is None else self.seed + len(self.history)
        stream = generator.stream(pending.ids, **self.session.sampling_kwargs(seed))
        out: list[int] = []
        try:
            for token in stream:
                out.append(token.id)
                yield token
        except SpecgenError:
            raise
        except BaseException:  # GeneratorExit from close(), KeyboardInterrupt in a forward
            stream.close()  # first, so that stats say "interrupted" and the time spent
            # Ctrl-C can land in torch's inference-mode wrapper around the engine's generator,
            # outside the engine's own frame, which then never hears of it: say it here.
            generator.stats.stop_reason = "interrupted"
            self._finish(pending, out, generator.stats)
            raise
        self._finish(pending, out, generator.stats)

    def _finish(self, pending: Pending, out: list[int], stats: Stats) -> None:
        tokenizer = self.session.tokenizer
        ended = "interrupted" if stats.stop_reason == "interrupted" else "completed"
        answer = tokenizer.decode(out, skip_special_tokens=True)
        self.last = Turn(pending.user, answer, ended, stats)
        self.history.append(stats)
        if not out:
            return  # nothing answered: the message leaves no trace in the conversation
        self.turns.append(self.last)
        self.first = pending.first
        self._ids = torch.cat([pending.ids, torch.tensor(out, dtype=torch.long)])
        self._text = pending.text + tokenizer.decode(out, skip_special_tokens=False)

    def reset(self) -> None:
        self.turns, self.first, self._ids, self._text = [], 0, None, ""
        self.session.generator.reset()

    # --- slash commands -------------------------------------------------------------------

    def command(self, name: str, arg: str, width: int = 80) -> Reply:
        if name in ("exit", "quit"):
            return Reply(exit=True)
        handler = getattr(self, f"_cmd_{name}", None)
        if handler is None:
            close = difflib.get_close_matches(name, COMMANDS, n=1)
            hint = f" Did you mean /{close[0]}?" if close else ""
            return Reply([f"Unknown command /{name}.{hint} Type /help for the commands "
                          "(start a message with // to send a leading slash)."], error=True)
        try:
            return handler(arg, width) if name == "stats" else handler(arg)
        except SpecgenError as e:
            return Reply([str(e)], error=True)

    def _cmd_help(self, arg: str) -> Reply:
        width = max(len(usage) for usage, _ in COMMANDS.values())
        lines = [f"{usage:<{width}}  {what}" for usage, what in COMMANDS.values()]
        lines.append(f'{FENCE:<{width}}  a line of {FENCE} starts and ends a multi-line message')
        lines.append(f"{'Ctrl-C':<{width}}  stop the answer being generated")
        return Reply(lines)

    def _cmd_reset(self, arg: str) -> Reply:
        self.reset()
        return Reply(["New conversation."])

    def _cmd_system(self, arg: str) -> Reply:
        self.system = arg or None
        return Reply(["System prompt set." if arg else "System prompt cleared."])

    def _cmd_k(self, arg: str) -> Reply:
        k = _argument(int, arg, "/k", "a whole number of draft tokens", "4")
        self._override("/k", num_speculative_tokens=k)
        self.session.generator.k_max = k
        mode = "the most per step (adaptive)" if self.session.generator.adaptive else "every step"
        return Reply([f"K = {k}, {mode}."])

    def _cmd_adaptive(self, arg: str) -> Reply:
        on = _on_off(arg, "/adaptive")
        self._override("/adaptive", adaptive=on)
        self.session.generator.adaptive = on
        return Reply([f"Adaptive K {'on' if on else 'off'}."])

    def _cmd_tree(self, arg: str) -> Reply:
        on = _on_off(arg, "/tree")
        self._override("/tree", tree=on)
        self.session.generator.tree = on
        return Reply([f"Token trees {'on' if on else 'off'}."])

    def _cmd_temperature(self, arg: str) -> Reply:
        value = _argument(float, arg, "/temperature", "a number", "0.7")
        self._override("/temperature", temperature=value)
        return Reply([f"Temperature {value:g}{' (greedy)' if value == 0 else ''}."])

    def _override(self, command: str, **values) -> None:
        """Apply a command's values to the profile, validated as the command line's are
        (a non-finite or out-of-range value is refused and changes nothing)."""
        self.session.profile = with_overrides(self.session.profile, where=command, **values)

    def _cmd_stats(self, arg: str, width: int) -> Reply:
        return Reply(self.stats_lines(width))

    def _cmd_save(self, arg: str) -> Reply:
        if not arg:
            raise ConfigError("/save needs a file name: /save chat.md or /save chat.json.")
        path = Path(arg).expanduser()
        if path.suffix.lower() not in (".md", ".json"):
            raise ConfigError(f"/save writes .md (Markdown) or .json files, not {path.name!r}.")
        text = (transcript_markdown(self) if path.suffix.lower() == ".md"
                else json.dumps(transcript_json(self), ensure_ascii=False, indent=2) + "\n")
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"Cannot write {path}: {e.strerror}.") from None
        except ValueError:  # a NUL in the name
            raise ConfigError(f"Cannot write {path!r}: a file name cannot hold a NUL.") from None
        return Reply([f"Saved {len(self.turns)} turns to {path}."])

    def stats_lines(self, width: int = 80) -> list[RenderableType]:
        """This session's acceptance: the headline, per-position acceptance, accepted lengths."""
        if not self.history:
            return ["No answers yet."]
        s = summarize([stats_row(st, self.session) for st in self.history])
        n = len(self.history)
        head = (f"{n} answer{'s' * (n != 1)} · {s['new_tokens']:,} tokens · acceptance "
                f"{pct(s['acceptance_rate'])} · tau {s['tau'] or 0:.2f} · "
                f"{s['tokens_per_second'] or 0:.1f} tok/s")
        return [head, *profile_charts(self.session.profile.name, s, width)]


def stats_row(stats: Stats, session: Session) -> dict:
    """Stats in the shape of a history row, for cli_stats.summarize."""
    d = stats.to_dict()
    k_hist = Counter(stats.k_per_step)
    d["k_hist"] = [k_hist[k] for k in range(max([stats.k_max, *k_hist]) + 1)]
    d["wall_seconds"] = stats.total_seconds
    return {**d, "target": session.pair.target_name, "draft": session.pair.draft_name,
            "method": session.profile.speculation.method}


# --- transcripts --------------------------------------------------------------------------

def transcript_json(chat: Chat) -> dict:
    pair = chat.session.pair
    return {
        "profile": chat.session.profile.name,
        "target": pair.target_name,
        "draft": pair.draft_name,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "system": chat.system,
        "turns": [{"user": t.user, "assistant": t.answer, "ended": t.ended,
                   "stats": t.stats.to_dict()} for t in chat.turns],
    }


def transcript_markdown(chat: Chat) -> str:
    pair = chat.session.pair
    out = [f"# specgen chat · {chat.session.profile.name}", "",
           f"{pair.draft_name or 'no draft'} → {pair.target_name} · "
           f"{time.strftime('%Y-%m-%d %H:%M')}", ""]
    if chat.system:
        out += ["## System", "", chat.system, ""]
    for turn in chat.turns:
        out += ["## User", "", turn.user, "", "## Assistant", "", turn.answer, ""]
        if turn.ended == "interrupted":
            out += ["*(interrupted)*", ""]
    return "\n".join(out)


# --- the terminal edge --------------------------------------------------------------------

@contextmanager
def line_editing(path: Path) -> Iterator[None]:
    """input() with line editing and a history kept in `path`, where readline exists."""
    try:
        import readline
    except ImportError:  # e.g. Windows without pyreadline: plain input() still works
        yield
        return
    try:
        readline.read_history_file(path)
    except OSError:
        pass  # first run, or unreadable: start empty
    readline.set_history_length(1000)
    try:
        yield
    finally:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
        except OSError:
            pass  # losing input history is not worth an error


def pipe_line(_prompt: str) -> str:
    """read_line for a pipe: no prompt, EOFError at the end."""
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\r\n")


def repl(chat: Chat, read_line: Callable[[str], str], out: Console, info: Console,
         stats_db: Path | None = None, record_prompt: bool = False) -> None:
    """Read messages and commands until /exit or end of input. Answers go to `out`;
    everything else (notices, command output, summaries) to `info`. Ctrl-C stops an answer
    and the chat goes on; SIGTERM (errors.Terminated) and a closed `out` (BrokenPipeError)
    end the chat, re-raised once the answer so far is recorded."""
    printer = TokenPrinter(out)
    warned = False
    while True:
        try:
            text = read_message(read_line)
        except Terminated:
            raise
        except KeyboardInterrupt:
            info.print("\n(Ctrl-D or /exit to leave)", style="dim", highlight=False)
            continue
        except EOFError:
            break
        if not text.strip():
            continue
        command = parse_command(text)
        if command is not None:
            reply = chat.command(*command, width=info.width)
            for line in reply.lines:
                style = "yellow" if reply.error else None
                info.print(line, style=style, markup=False, highlight=False)
            if reply.exit:
                break
            continue
        try:
            turn, stopped_by = answer_turn(chat, unescape(text), printer, info)
        except SpecgenError as e:
            info.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            continue
        prompt = turn.user if record_prompt else None
        warning = record_run(chat.session.record("chat", turn.stats, turn.ended, prompt), stats_db)
        if warning and not warned:
            info.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
            warned = True
        if isinstance(stopped_by, (Terminated, BrokenPipeError)):
            raise stopped_by


def answer_turn(chat: Chat, message: str, printer: TokenPrinter, info: Console
                ) -> tuple[Turn, BaseException | None]:
    """Stream one answer; Ctrl-C or SIGTERM stops it and keeps what was said, and so does a
    closed output. Returns the turn and what stopped it (None: it ended by itself)."""
    pending = chat.prepare(message)
    if pending.dropped:
        info.print(f"(the conversation outgrew the context of {chat.context_limit:,} tokens: "
                   f"dropped the oldest {pending.dropped} turn{'s' * (pending.dropped > 1)})",
                   style="yellow", highlight=False)
    decoder = IncrementalDecoder(chat.session.tokenizer)
    stream = chat.answer(pending)
    source = "bonus"
    stopped_by: BaseException | None = None
    try:
        for token in stream:
            printer.write(decoder.push(token.id), token.source)
            source = token.source
    except (KeyboardInterrupt, BrokenPipeError) as e:
        stream.close()  # the turn is kept as interrupted (Chat.answer)
        stopped_by = e
    if not isinstance(stopped_by, BrokenPipeError):
        try:
            printer.write(decoder.flush(), source)
            printer.console.file.write("\n")
            printer.console.file.flush()
        except BrokenPipeError as e:
            stopped_by = e
    assert chat.last is not None
    if not isinstance(stopped_by, BrokenPipeError):
        info.print(summary_line(chat.last.stats), style="dim", soft_wrap=True, highlight=False)
    return chat.last, stopped_by


@dataclass(frozen=True)
class ChatRequest:
    """What cli/chat.py parsed: the profile with the options applied, and where turns go."""

    profile: Profile
    seed: int | None = None
    no_color: bool = False
    stats_db: Path | None = None
    record_prompt: bool = False


def run(request: ChatRequest, load_session: Callable) -> None:
    """Load the pair and hold the conversation: each line of a piped stdin a turn (answers
    alone on stdout), else a terminal session with line editing and its history file."""
    prof = request.profile
    session = load_session(prof)
    conversation = Chat(session, prof.generation.system_prompt, request.seed)
    out = make_console(no_color=request.no_color)
    history = (request.stats_db, request.record_prompt)
    if not sys.stdin.isatty():
        repl(conversation, pipe_line, out, err, *history)
        return
    pair = session.pair
    err.print(f"[bold]specgen chat[/] · {prof.name}: {pair.draft_name or 'no draft'} → "
              f"{pair.target_name}", highlight=False)
    err.print('/help for commands · \"\"\" for multi-line input · Ctrl-C stops an answer · '
              "Ctrl-D leaves", style="dim", highlight=False)
    printer = TokenPrinter(out)
    if printer.styled:
        err.print(printer.legend())
    with line_editing(chat_history()):
        repl(conversation, input, out, err, *history)
