"""`specgen chat`: a conversation on one loaded model pair."""

from __future__ import annotations

import sys

from specgen.app.render import TokenPrinter, make_console
from specgen.paths import chat_history
from specgen.cli.options import (GENERATION, MODELS, err, load_session, pause_gc, prefetch,
                                 profile_with_options, shared, use_color)
from specgen.profiles import check_seed

HELP = """Chat with the model pair: a multi-turn conversation streamed as it is verified.

Each turn is coloured like [bold]specgen run[/]. The models stay loaded and their caches
are kept between turns, so a new turn only prefills its own tokens. Commands: /help,
/reset, /system TEXT, /k N, /adaptive on|off, /tree on|off, /temperature X, /stats,
/save FILE, /exit.
A line of \"\"\" starts and ends a multi-line message; Ctrl-C stops an answer, Ctrl-D leaves.
With stdin not a terminal, each line is a turn and only the answers go to stdout.

[bold]Examples[/]

  specgen chat

  specgen chat --profile llama3-8b --system "You are a terse senior engineer."

  printf 'hi\\nand in French?\\n' | specgen chat > answers.txt
"""


@shared(*GENERATION, *MODELS, "no_color", "stats_db", "record_prompt", "debug")
def chat(**options) -> None:
    use_color(options["no_color"])
    check_seed(options["seed"])
    prof = profile_with_options(options)
    prefetch(prof)  # the weights are read from disk while torch is imported
    pause_gc()  # until load_session has loaded the models
    from specgen.app import chat as chat_app  # loads torch: after every check of the input

    session = load_session(prof)
    conversation = chat_app.Chat(session, prof.generation.system_prompt, options["seed"])
    out = make_console(no_color=options["no_color"])
    history = (options["stats_db"], options["record_prompt"])
    if not sys.stdin.isatty():
        chat_app.repl(conversation, chat_app.pipe_line, out, err, *history)
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
        chat_app.repl(conversation, input, out, err, *history)
