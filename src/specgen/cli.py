"""The `specgen` command line. Errors a user can cause print one line and exit 2;
`--debug` shows the traceback instead."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from specgen import __version__
from specgen.errors import SpecgenError

app = typer.Typer(
    name="specgen",
    help="Exact speculative decoding for local LLMs: a small draft model proposes, the "
    "large target model verifies, and the output is exactly the target's.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
DEBUG = "--debug" in sys.argv


def _version(value: bool) -> None:
    if value:
        print(f"specgen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """specgen: faster local generation that never changes what the model says."""


def main() -> None:
    """Entry point: run the app, turning SpecgenError into one clear line and exit code 2."""
    try:
        app(standalone_mode=False)
    except SpecgenError as e:
        if DEBUG:
            raise
        err.print(f"[bold red]error:[/] {e}", highlight=False)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        err.print("Aborted.")
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
