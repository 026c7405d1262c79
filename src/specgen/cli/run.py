"""`specgen run`: one prompt, one streamed answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from specgen.app.render import TokenPrinter, make_console, summary_line
from specgen.app.store import record_run
from specgen.cli.options import (GENERATION, MODELS, err, load_session, pause_gc, prefetch,
                                 profile_with_options, read_prompt, shared, use_color, warn)
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
    from specgen.app.answer import answer  # loads torch: after every check of the input

    session = load_session(prof)
    out = make_console(no_color=options["no_color"])
    as_json = output_format == "json"
    printer = TokenPrinter(out)
    if printer.styled and not as_json:
        err.print(printer.legend())
    result = answer(session, text, options["seed"], on_text=None if as_json else printer.write)
    # Recorded first: whatever ended the answer (Ctrl-C, SIGTERM, a closed stdout), the run
    # is in the history before anything else is written.
    record = options["record_prompt"]
    warning = record_run(session.record("run", result.stats, result.ended, text if record else None),
                         options["stats_db"])
    if not isinstance(result.stopped_by, BrokenPipeError):
        if as_json:
            doc = {"text": result.text, "tokens": result.tokens, "stats": result.stats.to_dict(),
                   "profile": prof.name, "target": session.pair.target_name,
                   "draft": session.pair.draft_name}
            out.file.write(json.dumps(doc, ensure_ascii=False) + "\n")
        else:
            out.file.write("\n")
        out.file.flush()  # a closed stdout shows here, not at exit
        err.print(summary_line(result.stats), style="dim", soft_wrap=True, highlight=False)
    if warning:
        warn(warning)
    if result.stopped_by is not None:
        raise result.stopped_by  # the exit code says what ended it (cli/signals.py)
