"""`specgen stats`: parse the options (the filters into a Selection, --since into a time);
specgen.commands.stats does the rest."""

from __future__ import annotations

import re
import time
from datetime import datetime
from enum import Enum
from pathlib import Path

import typer

from specgen.commands import stats as flow
from specgen.errors import ConfigError
from specgen.paths import history_db

app = typer.Typer(rich_markup_mode="rich")

UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class Format(str, Enum):
    text = "text"
    json = "json"


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
    selection = flow.Selection(_db(stats_db), profile, parse_since(since) if since else None,
                               last, command)
    ctx.obj = selection
    if ctx.invoked_subcommand is not None:
        return
    flow.show(selection, runs, fmt is Format.json)


def _selection(ctx: typer.Context, stats_db: Path | None) -> flow.Selection:
    """The callback's selection, with a --stats-db given after the subcommand."""
    selection: flow.Selection = ctx.obj
    if stats_db is not None:
        selection.db_path = stats_db
    return selection


@app.command()
def export(
    ctx: typer.Context,
    csv_path: Path = typer.Option(..., "--csv", metavar="FILE", help="CSV file to write; - for "
                                  "standard output."),
    stats_db: Path | None = DB_OPTION,
) -> None:
    """Write the runs (after --profile / --since / --last) as CSV, one row per run."""
    flow.export(_selection(ctx, stats_db), csv_path)


@app.command()
def clear(
    ctx: typer.Context,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    stats_db: Path | None = DB_OPTION,
) -> None:
    """Delete the whole run history (asks first)."""
    flow.clear(_selection(ctx, stats_db), yes)
