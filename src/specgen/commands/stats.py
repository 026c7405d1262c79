"""`specgen stats`: acceptance, tau and speed over the recorded run history.

Aggregates are ratios of sums (sum accepted / sum proposed, sum tokens / sum target passes),
never means of per-run ratios, so a long run weighs what it generated; runs are summed per
profile, drafting method and draft (app/report.py). Bench measurements, which earlier
versions recorded, are left out unless asked for (`--command bench`). Plain functions of the
parsed options (cli/stats.py declares them and parses --since).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from specgen.app.report import by_group, render_runs, render_summary, run_figures, summarize
from specgen.app.store import clear_runs, load_runs
from specgen.errors import ConfigError


@dataclass
class Selection:
    """Which history and which runs of it: the options of `specgen stats` itself."""

    db_path: Path
    profile: str | None = None
    since: float | None = None
    last: int | None = None
    command: str | None = None  # None: what users ran (all but bench); "all": everything

    @property
    def filtered(self) -> bool:
        return (self.profile is not None or self.since is not None or self.last is not None
                or self.command is not None)

    def load(self) -> list[dict]:
        command = None if self.command in (None, "all") else self.command
        skip = DEFAULT_SKIP if self.command is None else ()
        return load_runs(self.db_path, self.profile, self.since, self.last, command, skip)


# Commands whose records are no user's runs: bench measurements (recorded by earlier
# versions) count other programs' decoding, and would skew what users read here.
DEFAULT_SKIP = ("bench",)


def print_empty(console: Console, selection: Selection) -> None:
    everything = load_runs(selection.db_path)
    if everything:
        console.print(
            f"No runs match these filters ({len(everything):,} records in the history); "
            f"loosen --profile / --since / --last / --command to see them.", highlight=False,
            markup=False)
        return
    console.print(
        f"No runs recorded yet (history: {escape(str(selection.db_path))}).\n"
        f"Every [bold]specgen run[/] and chat turn is recorded. "
        f"Try:\n\n  specgen run \"Explain speculative decoding in one paragraph\"\n\n"
        f"then [bold]specgen stats[/] again.", highlight=False)


def _json_safe(value):
    """`value` with non-finite numbers as null: JSON has no NaN or Infinity, and histories
    written before specgen refused them may hold some."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def show(selection: Selection, runs: bool = False, as_json: bool = False) -> None:
    """The summary per profile and drafting, or the runs one a line (`runs`), as text or
    JSON."""
    rows = selection.load()
    if as_json:
        if runs:
            doc = {"runs": [{**r, **run_figures(r)} for r in rows]}
        else:
            doc = {"runs": len(rows), "groups": by_group(rows), "total": summarize(rows)}
        typer.echo(json.dumps(_json_safe({"db": str(selection.db_path), **doc}), indent=2))
        return
    console = Console(highlight=False)
    if not rows:
        print_empty(console, selection)
    elif runs:
        render_runs(console, rows)
    else:
        render_summary(console, rows, selection.db_path)


def export(selection: Selection, csv_path: Path) -> None:
    """Write the selected runs as CSV, one row per run (`-`: standard output)."""
    rows = selection.load()
    columns = list(rows[0]) if rows else []
    to_stdout = str(csv_path) == "-"
    try:
        f = sys.stdout if to_stdout else open(csv_path, "w", newline="", encoding="utf-8")
        try:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            for r in rows:
                writer.writerow({k: json.dumps(v) if isinstance(v, list) else v
                                 for k, v in r.items()})
        finally:
            if not to_stdout:
                f.close()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise ConfigError(f"Cannot write {csv_path}: {e.strerror or e}. Give --csv a file "
                          "in a folder you can write (or - for standard output).") from None
    if not to_stdout:
        Console(stderr=True, highlight=False).print(f"wrote {len(rows):,} runs to {csv_path}")


def clear(selection: Selection, yes: bool = False) -> None:
    """Delete the whole run history (asks first, unless `yes`)."""
    if selection.filtered:
        raise ConfigError("`specgen stats clear` deletes the whole history and takes no "
                          "--profile / --since / --last; drop them.")
    path = selection.db_path
    n = len(load_runs(path))
    if n == 0:
        typer.echo(f"The history is already empty ({path}).")
        return
    if not yes:
        typer.confirm(f"Delete all {n:,} runs from {path}?", abort=True)
    clear_runs(path)
    typer.echo(f"Deleted {n:,} runs.")
