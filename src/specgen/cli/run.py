"""`specgen run`: one prompt, one streamed answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from specgen.app.render import TokenPrinter, make_console, summary_line
from specgen.app.store import record_run
from specgen.cli.options import (DEBUG, DEVICE, DRAFT_QUANTIZATION, DRAFT_RUNTIME, K, MAX_NEW_TOKENS,
                                 METHOD, NO_ADAPTIVE, NO_COLOR, PROFILE, RAW, RECORD_PROMPT, SEED,
                                 STATS_DB, SYSTEM, TARGET_QUANTIZATION, TEMPERATURE, TOP_K, TOP_P,
                                 err, load_session, profile_with_options, read_prompt,
                                 use_color, warn)
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


def run(
    prompt: Optional[str] = typer.Argument(None, help="The prompt; '-' (or a pipe) reads stdin."),
    profile: str = PROFILE,
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="Read the prompt from a file."),
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
    raw: bool = RAW,
    system: Optional[str] = SYSTEM,
    output_format: str = typer.Option("text", "--format", help="text or json (one object on stdout)."),
    no_color: bool = NO_COLOR,
    stats_db: Optional[Path] = STATS_DB,
    record_prompt: bool = RECORD_PROMPT,
    debug: bool = DEBUG,
) -> None:
    if output_format not in ("text", "json"):
        raise ConfigError(f"--format must be 'text' or 'json', got {output_format!r}.")
    use_color(no_color)
    check_seed(seed)
    text = read_prompt(prompt, file)
    prof = profile_with_options(
        profile, max_new_tokens, temperature, top_p, top_k, k, no_adaptive, method, system, raw,
        device=device, target_quantization=target_quantization,
        draft_quantization=draft_quantization, draft_runtime=draft_runtime,
    )
    from specgen.app.answer import answer  # loads torch: after every check of the input

    session = load_session(prof)
    out = make_console(no_color=no_color)
    as_json = output_format == "json"
    printer = TokenPrinter(out)
    if printer.styled and not as_json:
        err.print(printer.legend())
    result = answer(session, text, seed, on_text=None if as_json else printer.write)
    # Recorded first: whatever ended the answer (Ctrl-C, SIGTERM, a closed stdout), the run
    # is in the history before anything else is written.
    warning = record_run(
        session.record("run", result.stats, result.ended, text if record_prompt else None),
        stats_db)
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
