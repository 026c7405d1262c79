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

from specgen.choices import MAX_K, METHODS, MIN_K, QUANTIZATIONS, RUNTIMES, listing
from specgen.errors import ConfigError
from specgen.profiles import DEFAULT_PROFILE, Profile, load_profile, with_overrides

if TYPE_CHECKING:
    from specgen.app.session import Session

err = Console(stderr=True)


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


def load_session(prof: Profile, peer_draft: bool = False, with_head: bool = False) -> Session:
    """Load the profile's models behind a status line (`peer_draft`, `with_head`: see
    loading.load_pair)."""
    from transformers.utils import logging as hf_logging

    from specgen.app.session import open_session  # loads torch

    hf_logging.disable_progress_bar()  # our own status line says what is loading
    with err.status("Loading models…") as status:
        return open_session(prof, progress=lambda msg: status.update(msg), peer_draft=peer_draft,
                            with_head=with_head)


def read_prompt(prompt: str | None, file: Path | None) -> str:
    """The prompt from the argument, a file, or stdin ('-' or a pipe)."""
    if file is not None:
        if prompt is not None:
            raise ConfigError("Give the prompt either as an argument or with --file, not both.")
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"Cannot read the prompt file {file}: {e.strerror}.") from None
    elif prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        text = sys.stdin.read()
    elif prompt is None:
        raise ConfigError('No prompt given. Try: specgen run "write quicksort in python"')
    else:
        text = prompt
    if not text.strip():
        raise ConfigError("The prompt is empty: give some text to continue or answer.")
    return text
