"""`specgen cache list | prune | verify`: parse the options; specgen.commands.cache does the
rest."""

from __future__ import annotations

import typer

app = typer.Typer(help="See, prune and verify the model cache (converted and quantized copies).",
                  no_args_is_help=True)

FORMAT = typer.Option("text", "--format", help="text or json.")


@app.command("list")
def list_cmd(output_format: str = FORMAT) -> None:
    """Every entry with its size and the profiles (bundled or yours) that use it."""
    from specgen.commands import cache

    cache.list_cmd(output_format)


@app.command("prune")
def prune_cmd(
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; remove nothing."),
) -> None:
    """Remove the entries no bundled or user profile needs (models no profile names, other
    dtypes or schemes, copies made by older releases, interrupted writes)."""
    from specgen.commands import cache

    cache.prune_cmd(dry_run)


@app.command("verify")
def verify_cmd(
    delete: bool = typer.Option(False, "--delete", help="Remove the damaged entries (the next "
                                "run rebuilds them from their source)."),
) -> None:
    """Rehash every converted and quantized entry in full against the hashes recorded when
    it was made (a load checks sizes and a sample of each file only)."""
    from specgen.commands import cache

    cache.verify_cmd(delete)
