"""`specgen run`: parse the options, read the prompt; specgen.commands.run does the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from specgen.cli.options import (GENERATION, MODELS, load_session, pause_gc, prefetch,
                                 profile_with_options, read_prompt, shared, use_color)
from specgen.errors import ConfigError
from specgen.profiles import check_seed

HELP = """Generate an answer with speculative decoding, streamed as it is verified.

In a terminal each token is coloured by where it came from: [green]accepted[/] (a draft token
the target kept), [yellow]resampled[/] (the target's correction) and [cyan]bonus[/] (the
target's extra token). A summary line follows on stderr. Piped output is plain text.

[bold]Examples[/]

  specgen run "write quicksort in python"

  specgen run --profile llama3-8b --temperature 0.7 --seed 1 "a haiku about caches"

  cat notes.txt | specgen run --raw -

  specgen run --file prompt.md --format json > answer.json
"""


@shared(*GENERATION, "raw", *MODELS, "no_color", "stats_db", "record_prompt", "debug")
def run(
    prompt: Optional[str] = typer.Argument(None, help="The prompt; '-' (or a pipe) reads stdin."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Read the prompt from a file."),
    output_format: str = typer.Option("text", "--format", help="text or json (one object on stdout)."),
    **options,
) -> None:
    if output_format not in ("text", "json"):
        raise ConfigError(f"--format must be 'text' or 'json', got {output_format!r}.")
    use_color(options["no_color"])
    check_seed(options["seed"])
    text = read_prompt(prompt, file)
    prof = profile_with_options(options)
    prefetch(prof)  # the weights are read from disk while torch is imported
    pause_gc()  # until load_session has loaded the models
    from specgen.commands import run as flow

    flow.run(flow.RunRequest(prof, text, options["seed"], output_format == "json",
                             options["no_color"], options["stats_db"], options["record_prompt"]),
             load_session)
