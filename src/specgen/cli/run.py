"""`specgen run`: one prompt, one streamed answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from specgen.app.render import TokenPrinter, make_console, summary_line
from specgen.app.store import record_run
from specgen.cli.options import (GENERATION, MODELS, err, load_session, prefetch,
                                 profile_with_options, read_prompt, shared, use_color)
from specgen.errors import ConfigError

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
    text = read_prompt(prompt, file)
    prof = profile_with_options(options)
    prefetch(prof)  # the weights are read from disk while torch is imported
    from specgen.app.answer import answer  # loads torch

    session = load_session(prof)
    out = make_console(no_color=options["no_color"])
    as_json = output_format == "json"
    printer = TokenPrinter(out)
    if printer.styled and not as_json:
        err.print(printer.legend())
    result = answer(session, text, options["seed"], on_text=None if as_json else printer.write)
    record = options["record_prompt"]
    warning = record_run(session.record("run", result.stats, result.ended, text if record else None),
                         options["stats_db"])
    if as_json:
        doc = {"text": result.text, "tokens": result.tokens, "stats": result.stats.to_dict(),
               "profile": prof.name, "target": session.pair.target_name,
               "draft": session.pair.draft_name}
        out.file.write(json.dumps(doc, ensure_ascii=False) + "\n")
    else:
        out.file.write("\n")
    err.print(summary_line(result.stats), style="dim", soft_wrap=True, highlight=False)
    if warning:
        err.print(f"[yellow]warning:[/] {warning}")
    if result.ended == "interrupted":
        raise typer.Exit(130)
