"""`specgen chat`: a conversation on one loaded model pair."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from specgen.app.render import TokenPrinter, make_console
from specgen.paths import chat_history
from specgen.profiles import check_seed
from specgen.cli.options import (DEBUG, DEVICE, DRAFT_QUANTIZATION, DRAFT_RUNTIME, K, MAX_NEW_TOKENS,
                                 METHOD, NO_ADAPTIVE, NO_COLOR, PROFILE, RECORD_PROMPT, SEED,
                                 STATS_DB, SYSTEM, TARGET_QUANTIZATION, TEMPERATURE, TOP_K, TOP_P,
                                 err, load_session, profile_with_options, use_color)

HELP = """Chat with the model pair: a multi-turn conversation streamed as it is verified.

Each turn is coloured like [bold]specgen run[/]. The models stay loaded and their caches
are kept between turns, so a new turn only prefills its own tokens. Commands: /help,
/reset, /system TEXT, /k N, /adaptive on|off, /temperature X, /stats, /save FILE, /exit.
A line of \"\"\" starts and ends a multi-line message; Ctrl-C stops an answer, Ctrl-D leaves.
With stdin not a terminal, each line is a turn and only the answers go to stdout.

[bold]Examples[/]

  specgen chat

  specgen chat --profile llama3-8b --system "You are a terse senior engineer."

  printf 'hi\\nand in French?\\n' | specgen chat > answers.txt
"""


def chat(
    profile: str = PROFILE,
    max_new_tokens: Optional[int] = MAX_NEW_TOKENS,
    temperature: Optional[float] = TEMPERATURE,
    top_p: Optional[float] = TOP_P,
    top_k: Optional[int] = TOP_K,
    seed: Optional[int] = SEED,
    k: Optional[int] = K,
    no_adaptive: bool = NO_ADAPTIVE,
    method: Optional[str] = METHOD,
    device: Optional[str] = DEVICE,
    target_quantization: Optional[str] = TARGET_QUANTIZATION,
    draft_quantization: Optional[str] = DRAFT_QUANTIZATION,
    draft_runtime: Optional[str] = DRAFT_RUNTIME,
    system: Optional[str] = SYSTEM,
    no_color: bool = NO_COLOR,
    stats_db: Optional[Path] = STATS_DB,
    record_prompt: bool = RECORD_PROMPT,
    debug: bool = DEBUG,
) -> None:
    use_color(no_color)
    check_seed(seed)
    prof = profile_with_options(
        profile, max_new_tokens, temperature, top_p, top_k, k, no_adaptive, method, system,
        device=device, target_quantization=target_quantization,
        draft_quantization=draft_quantization, draft_runtime=draft_runtime,
    )
    from specgen.app import chat as chat_app  # loads torch: after every check of the input

    session = load_session(prof)
    conversation = chat_app.Chat(session, prof.generation.system_prompt, seed)
    out = make_console(no_color=no_color)
    if not sys.stdin.isatty():
        chat_app.repl(conversation, chat_app.pipe_line, out, err, stats_db, record_prompt)
        return
    pair = session.pair
    err.print(f"[bold]specgen chat[/] · {prof.name}: {pair.draft_name or 'no draft'} → "
              f"{pair.target_name}", highlight=False)
    err.print('/help for commands · \"\"\" for multi-line input · Ctrl-C stops an answer · '
              "Ctrl-D leaves", style="dim", highlight=False)
    printer = TokenPrinter(out)
    if printer.styled:
        err.print(printer.legend())
    with chat_app.line_editing(chat_history()):
        chat_app.repl(conversation, input, out, err, stats_db, record_prompt)
