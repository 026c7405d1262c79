"""What the commands share: the error console, the options of run, chat and bench (declared
once here, their choices from specgen.choices), and the steps every generating command takes
before it generates (read the prompt, apply the options to the profile, load the models)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from specgen.choices import MAX_K, METHODS, MIN_K, QUANTIZATIONS, RUNTIMES, listing
from specgen.errors import ConfigError
from specgen.profiles import DEFAULT_PROFILE, Profile, load_profile, utf8_text, with_overrides

if TYPE_CHECKING:
    from specgen.app.session import Session

err = Console(stderr=True)


def warn(message: str) -> None:
    """One `warning:` line on stderr (the message's brackets are text, not markup)."""
    err.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def debug_enabled() -> bool:
    return "--debug" in sys.argv or os.environ.get("SPECGEN_DEBUG") == "1"


def use_color(no_color: bool) -> None:
    err.no_color = no_color or bool(os.environ.get("NO_COLOR"))


PROFILE = typer.Option(
    DEFAULT_PROFILE, "--profile", "-p", help="Profile name or path to a .toml file."
)
MAX_NEW_TOKENS = typer.Option(None, "--max-new-tokens", "-n", help="Most tokens to generate.")
TEMPERATURE = typer.Option(None, "--temperature", "-t", help="0 is greedy.")
TOP_P = typer.Option(None, "--top-p", help="Nucleus sampling mass, in (0, 1].")
TOP_K = typer.Option(None, "--top-k", help="Sample from the k likeliest tokens (0: off).")
SEED = typer.Option(None, "--seed", help="Seed for reproducible sampling.")
K = typer.Option(
    None, "--k",
    help=f"Speculative tokens per step, {MIN_K} to {MAX_K} (the most, when adaptive; 0: off).")
NO_ADAPTIVE = typer.Option(False, "--no-adaptive", help="Always draft exactly K tokens.")
METHOD = typer.Option(None, "--method", help=f"Who drafts: {listing(METHODS)}.")
DEVICE = typer.Option(None, "--device", help="auto, cpu, cuda or cuda:N (both models).")
TARGET_QUANTIZATION = typer.Option(
    None, "--target-quantization",
    help=f"{listing(QUANTIZATIONS)} (docs/profiles.md says which run where).")
DRAFT_QUANTIZATION = typer.Option(
    None, "--draft-quantization", help="Same choices, for the draft model.")
DRAFT_RUNTIME = typer.Option(
    None, "--draft-runtime",
    help=f"{listing(RUNTIMES)}: llama.cpp runs a GGUF draft on its CPU kernels "
    "(needs llama-cpp-python).")
RAW = typer.Option(False, "--raw", help="Plain continuation: no chat template.")
SYSTEM = typer.Option(None, "--system", help="System prompt (chat template only).")
NO_COLOR = typer.Option(False, "--no-color", help="No colours (NO_COLOR is honoured too).")
STATS_DB = typer.Option(None, "--stats-db", help="Run-history database to record into.")
RECORD_PROMPT = typer.Option(False, "--record-prompt", help="Store the prompt text in the history.")
DEBUG = typer.Option(False, "--debug", help="Show tracebacks for errors.")


def profile_with_options(
    profile: str, max_new_tokens: int | None = None, temperature: float | None = None,
    top_p: float | None = None, top_k: int | None = None, k: int | None = None,
    no_adaptive: bool = False, method: str | None = None, system: str | None = None,
    raw: bool = False, **models: str | None,
) -> Profile:
    """The named profile with the shared command-line options applied; `models` takes
    device, target_quantization, draft_quantization and draft_runtime."""
    return with_overrides(
        load_profile(profile),
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
        num_speculative_tokens=k, adaptive=False if no_adaptive else None, method=method,
        system_prompt=system, chat_template=False if raw else None, **models,
    )


def load_session(prof: Profile, peer_draft: bool = False) -> Session:
    """Load the profile's models behind a status line (`peer_draft`: see loading.load_pair)."""
    from transformers.utils import logging as hf_logging

    from specgen.app.session import open_session  # loads torch

    hf_logging.disable_progress_bar()  # our own status line says what is loading
    _quiet_gguf_progress()
    with err.status("Loading models…") as status:
        return open_session(prof, progress=lambda msg: status.update(msg), peer_draft=peer_draft)


def _quiet_gguf_progress() -> None:
    """transformers' GGUF reader draws its own tqdm bar (not behind disable_progress_bar)
    beside our status line: silence it."""
    import functools

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # no gguf package: nothing converts
        return
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None and not isinstance(bar, functools.partial):
        gguf_utils.tqdm = functools.partial(bar, disable=True)


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
