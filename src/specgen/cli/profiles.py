"""`specgen profiles list | show NAME | validate FILE | check`: parse the arguments;
specgen.commands.profiles does the rest."""

from __future__ import annotations

from pathlib import Path

import typer

from specgen.profiles import DEFAULT_PROFILE

app = typer.Typer(help="List, show and check model profiles.", no_args_is_help=True)


@app.command("list")
def list_cmd() -> None:
    """All profiles: the user's (which shadow bundled ones of the same name), then bundled."""
    from specgen.commands import profiles

    profiles.list_cmd()


@app.command("show")
def show_cmd(name: str = typer.Argument(DEFAULT_PROFILE, help="Profile name or .toml path.")) -> None:
    """The resolved profile (after `extends` and defaults), as TOML."""
    from specgen.commands import profiles

    profiles.show_cmd(name)


@app.command("validate")
def validate_cmd(file: Path = typer.Argument(..., help="A profile .toml file.")) -> None:
    """Check a profile file: syntax, keys, types and allowed values."""
    from specgen.commands import profiles

    profiles.validate_cmd(file)


@app.command("check")
def check_cmd() -> None:
    """Check every profile found (bundled and yours): one line each; exit 2 if any is invalid."""
    from specgen.commands import profiles

    profiles.check_cmd()
