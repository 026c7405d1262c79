"""`specgen stats`: acceptance, tau and speed over the recorded run history.

Aggregates are ratios of sums (sum accepted / sum proposed, sum tokens / sum target passes),
never means of per-run ratios, so a long run weighs what it generated; runs are summed per
profile, drafting method and draft (app/report.py). Bench measurements, which earlier
versions recorded, are left out unless asked for (`--command bench`).
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from specgen.app.report import by_group, render_runs, render_summary, run_figures, summarize
from specgen.app.store import clear_runs, load_runs
from specgen.errors import ConfigError
from specgen.paths import history_db

app = typer.Typer(rich_markup_mode="rich")

UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class Format(str, Enum):
    text = "text"
    json = "json"


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


DB_OPTION = typer.Option(
    None, "--stats-db", metavar="PATH", help="History database (default: $SPECGEN_STATS_DB, "
    "else history.sqlite3 in the user data directory)."
)


def parse_since(text: str, now: float | None = None) -> float:
    """'30m', '24h', '7d', '2w' (an age), or an ISO date / date-time in local time."""
    now = time.time() if now is None else now
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([mhdw])", text.strip().lower())
    if m:
        return now - float(m[1]) * UNITS[m[2]]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ConfigError(
            f"--since {text!r} is neither an age nor a date: give e.g. 24h, 7d, 2w or "
            f"2026-11-01 (or 2026-11-01T09:30)."
        ) from None


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


# ---------------------------------------------------------------- commands


def _db(path: Path | None) -> Path:
    return path if path is not None else history_db()


@app.callback(invoke_without_command=True)
def stats(
    ctx: typer.Context,
    profile: str | None = typer.Option(None, "--profile", "-p", help="Only this profile."),
    since: str | None = typer.Option(
        None, "--since", metavar="AGE|DATE", help="Only runs newer than 24h, 7d, 2w, or a date "
        "like 2026-11-01."),
    last: int | None = typer.Option(None, "--last", min=1, metavar="N",
                                    help="Only the N most recent runs."),
    command: str | None = typer.Option(
        None, "--command", metavar="NAME", help="Only this command's runs: run, chat, or bench "
        "(measurements recorded by earlier versions, left out by default); all: everything."),
    runs: bool = typer.Option(False, "--runs", help="List the runs, one a line."),
    fmt: Format = typer.Option(Format.text, "--format", help="text or json."),
    stats_db: Path | None = DB_OPTION,
) -> None:
    """Acceptance, tau and speed over the recorded runs and chat turns.

    Per profile and drafting (method and draft model, which make figures comparable):
    acceptance, tau, tokens/s, the estimated speedup; acceptance by draft position."""
    selection = Selection(_db(stats_db), profile, parse_since(since) if since else None, last,
                          command)
    ctx.obj = selection
    if ctx.invoked_subcommand is not None:
        return
    rows = selection.load()
    if fmt is Format.json:
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


@app.command()
def export(
    ctx: typer.Context,
    csv_path: Path = typer.Option(..., "--csv", metavar="FILE", help="CSV file to write; - for "
                                  "standard output."),
    stats_db: Path | None = DB_OPTION,
) -> None:
    """Write the runs (after --profile / --since / --last) as CSV, one row per run."""
    selection: Selection = ctx.obj
    if stats_db is not None:
        selection.db_path = stats_db
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


@app.command()
def clear(
    ctx: typer.Context,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    stats_db: Path | None = DB_OPTION,
) -> None:
    """Delete the whole run history (asks first)."""
    selection: Selection = ctx.obj
    if selection.filtered:
        raise ConfigError("`specgen stats clear` deletes the whole history and takes no "
                          "--profile / --since / --last; drop them.")
    path = stats_db if stats_db is not None else selection.db_path
    n = len(load_runs(path))
    if n == 0:
        typer.echo(f"The history is already empty ({path}).")
        return
    if not yes:
        typer.confirm(f"Delete all {n:,} runs from {path}?", abort=True)
    clear_runs(path)
    typer.echo(f"Deleted {n:,} runs.")
