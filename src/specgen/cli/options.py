"""What the commands' parsing shares: the options of run, chat and bench (declared once here,
their choices from specgen.choices), and the steps every generating command takes before its
flow (specgen.commands) generates: read the prompt, apply the options to the profile, load
the models behind a status line. The error console itself is app.render's."""

from __future__ import annotations

import gc
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.markup import escape

from specgen.app.render import err, warn
from specgen.choices import MAX_K, METHODS, MIN_K, QUANTIZATIONS, RUNTIMES, listing
from specgen.errors import ConfigError
from specgen.profiles import DEFAULT_PROFILE, Profile, load_profile, utf8_text, with_overrides

if TYPE_CHECKING:
    from specgen.app.session import Session


def reflow(help_text: str) -> str:
    """A command's help as Rich should see it: Typer's rich markup mode keeps every line
    break, so a paragraph wrapped for the source breaks raggedly in a terminal of another
    width. Each paragraph's lines are joined; a paragraph with an indented line (examples)
    is kept as written."""
    paragraphs = help_text.strip("\n").split("\n\n")
    return "\n\n".join(
        p if any(line.startswith(" ") for line in p.splitlines())
        else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs)


def debug_enabled() -> bool:
    return "--debug" in sys.argv or os.environ.get("SPECGEN_DEBUG") == "1"


def use_color(no_color: bool) -> None:
    err.no_color = no_color or bool(os.environ.get("NO_COLOR"))


# Every shared option once: its parameter name, type and declaration. A command takes them
# with @shared(...) and receives them as keyword arguments; one that declares its parameters
# itself takes a declaration as a default (PROFILE, K, DEVICE, TARGET_QUANTIZATION, DEBUG).
SHARED: dict[str, tuple[Any, Any]] = {
    "profile": (str, typer.Option(
        DEFAULT_PROFILE, "--profile", "-p", help="Profile name or path to a .toml file.")),
    "max_new_tokens": (Optional[int], typer.Option(
        None, "--max-new-tokens", "-n", help="Most tokens to generate.")),
    "temperature": (Optional[float], typer.Option(None, "--temperature", "-t", help="0 is greedy.")),
    "top_p": (Optional[float], typer.Option(
        None, "--top-p", help="Nucleus sampling mass, in (0, 1].")),
    "top_k": (Optional[int], typer.Option(
        None, "--top-k", help="Sample from the k likeliest tokens (0: off).")),
    "seed": (Optional[int], typer.Option(None, "--seed", help="Seed for reproducible sampling.")),
    "k": (Optional[int], typer.Option(
        None, "--k",
        help=f"Speculative tokens per step, {MIN_K} to {MAX_K} "
        "(the most, when adaptive; 0: off).")),
    "no_adaptive": (bool, typer.Option(
        False, "--no-adaptive", help="Always draft exactly K tokens.")),
    "no_tree": (bool, typer.Option(
        False, "--no-tree", help="Verify the draft model's chain alone, never a token tree.")),
    "method": (Optional[str], typer.Option(
        None, "--method", help=f"Who drafts: {listing(METHODS)}.")),
    "device": (Optional[str], typer.Option(
        None, "--device", help="auto, cpu, cuda or cuda:N (both models).")),
    "target_quantization": (Optional[str], typer.Option(
        None, "--target-quantization",
        help=f"{listing(QUANTIZATIONS)} (docs/profiles.md says which run where).")),
    "draft_quantization": (Optional[str], typer.Option(
        None, "--draft-quantization", help="Same choices, for the draft model.")),
    "draft_runtime": (Optional[str], typer.Option(
        None, "--draft-runtime",
        help=f"{listing(RUNTIMES)}: llama.cpp runs a GGUF draft on its CPU kernels "
        "(needs llama-cpp-python).")),
    "raw": (bool, typer.Option(False, "--raw", help="Plain continuation: no chat template.")),
    "system": (Optional[str], typer.Option(
        None, "--system", help="System prompt (chat template only).")),
    "no_color": (bool, typer.Option(
        False, "--no-color", help="No colours (NO_COLOR is honoured too).")),
    "stats_db": (Optional[Path], typer.Option(
        None, "--stats-db", help="Run-history database to record into.")),
    "record_prompt": (bool, typer.Option(
        False, "--record-prompt", help="Store the prompt text in the history.")),
    "debug": (bool, typer.Option(False, "--debug", help="Show tracebacks for errors.")),
}
PROFILE, K, DEVICE, TARGET_QUANTIZATION, DEBUG = (
    SHARED[name][1] for name in ("profile", "k", "device", "target_quantization", "debug"))
# The options that shape the profile a generating command runs (profile_with_options).
GENERATION = ("profile", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "k",
              "no_adaptive", "no_tree", "method", "system")
MODELS = ("device", "target_quantization", "draft_quantization", "draft_runtime")


def shared(*names: str) -> Callable[[Callable], Callable]:
    """Give a command the named SHARED options after its own parameters; the command takes
    them as keyword arguments (`**options`)."""
    def decorate(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=SHARED[name][1],
                                   annotation=SHARED[name][0]) for name in names]
        fn.__signature__ = sig.replace(parameters=own + added)
        fn.__annotations__ = {**fn.__annotations__, **{name: SHARED[name][0] for name in names}}
        return fn
    return decorate


def profile_with_options(options: dict[str, Any]) -> Profile:
    """The named profile with the shared command-line options applied: those of `options`
    that shape what runs (GENERATION, "raw" and MODELS; absent or None: the profile's)."""
    get = options.get
    return with_overrides(
        load_profile(options["profile"]),
        max_new_tokens=get("max_new_tokens"), temperature=get("temperature"),
        top_p=get("top_p"), top_k=get("top_k"), num_speculative_tokens=get("k"),
        adaptive=False if get("no_adaptive") else None, tree=False if get("no_tree") else None,
        method=get("method"),
        system_prompt=get("system"), chat_template=False if get("raw") else None,
        **{name: get(name) for name in MODELS},
    )


def prefetch(prof: Profile) -> None:
    """Start reading the profile's cached weights in the background (loading.cache_listing.prefetch)."""
    from specgen.loading.cache_listing import prefetch as start

    start(prof)


def pause_gc() -> None:
    """Pause Python's cyclic garbage collector until the models are loaded (load_session
    resumes it). Importing torch and loading a model make hundreds of thousands of objects,
    none of them garbage, which the collector would scan again and again (what that costs a
    start: docs/benchmarks.md)."""
    gc.disable()


def resume_gc() -> None:
    """The collector back on, with every object made so far (modules, models) frozen out of
    its later scans: they live as long as the process."""
    gc.freeze()
    gc.enable()


def load_session(prof: Profile, lean: bool = True, load: Callable | None = None) -> Session:
    """Load the profile's models behind a status line: `load(profile, progress)` gives the
    pair (loading.load_pair by default, `lean` as its: only `specgen bench` and `tune` hand
    their models to transformers' own forward, and bench loads its pair its own way).
    The garbage collector runs again from here on, whether the load succeeds or not."""
    from specgen.app.session import open_session, session_of  # loads torch
    try:
        with err.status("Loading models…") as status:
            progress = status.update
            session = (open_session(prof, progress, lean) if load is None
                       else session_of(prof, load(prof, progress)))
    finally:
        resume_gc()
    for notice in session.notices:
        err.print(f"[dim]note: {escape(notice)}[/]", highlight=False, soft_wrap=True)
    return session


def read_prompt(prompt: str | None, file: Path | None) -> str:
    """The prompt from the argument, a file, or stdin ('-' or a pipe)."""
    if file is not None:
        if prompt is not None:
            raise ConfigError("Give the prompt either as an argument or with --file, not both.")
        try:
            text = utf8_text(file.read_bytes(), f"The prompt file {file}")
        except OSError as e:
            raise ConfigError(f"Cannot read the prompt file {file}: {e.strerror}.") from None
    elif prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        stdin = getattr(sys.stdin, "buffer", None)  # bytes: the text decoder may let bad bytes by
        text = utf8_text(stdin.read() if stdin is not None else sys.stdin.read(), "The prompt on stdin")
    elif prompt is None:
        raise ConfigError('No prompt given. Try: specgen run "write quicksort in python"')
    else:
        text = utf8_text(prompt, "The prompt")
    if not text.strip():
        raise ConfigError("The prompt is empty: give some text to continue or answer.")
    return text
