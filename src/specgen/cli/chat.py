"""`specgen chat`: parse the options; specgen.commands.chat holds the conversation."""

from __future__ import annotations

from specgen.cli.options import (GENERATION, MODELS, load_session, pause_gc, prefetch,
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
    from specgen.commands import chat as flow  # loads torch: after every check of the input

    flow.run(flow.ChatRequest(prof, options["seed"], options["no_color"], options["stats_db"],
                              options["record_prompt"]), load_session)
