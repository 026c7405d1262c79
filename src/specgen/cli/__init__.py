"""The `specgen` command line: each command (one module here per verb) parses its options and
hands them to its flow (specgen.commands, one module there per verb). Errors a user can cause
print one line and exit 2; `--debug` shows the traceback instead. Ctrl-C exits 130, SIGTERM
143 and a closed stdout 141 (signals.py)."""

from __future__ import annotations

import typer
from rich.markup import escape
from typer.core import TyperGroup

from specgen import __version__
from specgen.cli import (bench, cache, chat, export, heads, profiles, run, serve, signals, stats,
                         triton_gate, tune)
from specgen.cli.options import debug_enabled, err, reflow, warn
from specgen.errors import SpecgenError


class _Group(TyperGroup):
    """Turns a SpecgenError raised by any command into one clear line and exit code 2
    (the traceback only with --debug or SPECGEN_DEBUG=1); Ctrl-C, SIGTERM and a closed stdout
    into their exit codes (130, 143, 141: the commands have kept what they made by then)."""

    def invoke(self, ctx):  # type: ignore[override]
        try:
            with signals.handled(warn):
                return super().invoke(ctx)
        except SpecgenError as e:
            if debug_enabled():
                raise
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (errors.Terminated)
            raise typer.Exit(signals.exit_code(e)) from None
        except BrokenPipeError as e:  # the reader of stdout is gone: end quietly
            signals.silence_stdout()
            raise typer.Exit(signals.exit_code(e)) from None


app = typer.Typer(
    cls=_Group,
    name="specgen",
    help="Exact speculative decoding for local LLMs: a small draft model proposes, the "
    "large target model verifies, and the output is exactly the target's.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
app.command(help=reflow(run.HELP), no_args_is_help=False)(run.run)
app.command(help=reflow(chat.HELP))(chat.chat)
app.command(help=reflow(bench.HELP))(bench.bench)
app.command(help=reflow(serve.HELP))(serve.serve)
app.add_typer(export.app, name="export")
app.command(help=reflow(tune.HELP))(tune.tune)
app.add_typer(stats.app, name="stats")
app.add_typer(profiles.app, name="profiles")
app.add_typer(cache.app, name="cache")
app.add_typer(heads.app, name="heads")


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
    """Console-script entry point: a command that is done leaves at once (signals.leave)."""
    triton_gate.install()
    try:
        app()
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            signals.leave(e.code)
        raise  # a message to print: the interpreter prints it
