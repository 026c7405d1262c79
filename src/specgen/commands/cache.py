"""`specgen cache list | prune | verify`: the converted and packed models specgen keeps.
Plain functions of the parsed options (cli/cache.py declares them)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from specgen.errors import SpecgenError

class CacheDamaged(SpecgenError):
    """`specgen cache verify` found damaged entries."""


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _row(entry) -> dict:
    return {"path": str(entry.path), "kind": entry.kind, "bytes": entry.size, "what": entry.what,
            "used_by": entry.used_by}


def list_cmd(output_format: str = "text") -> None:
    """Every entry with its size and the profiles (bundled or yours) that use it."""
    from specgen.loading import cache_listing
    from specgen.paths import cache_dir

    found = cache_listing.entries()
    if output_format == "json":
        print(json.dumps({"cache": str(cache_dir()), "entries": [_row(e) for e in found]}, indent=1))
        return
    table = Table(title=f"specgen cache: {cache_dir()}")
    for col in ("entry", "kind", "size", "what", "used by"):
        table.add_column(col, overflow="fold")
    for e in found:
        used = ", ".join(e.used_by) if e.used_by else "[yellow]nothing (prune removes it)[/]"
        table.add_row(f"{e.path.parent.name}/{e.path.name}", e.kind, _size(e.size), e.what, used)
    console = Console()
    console.print(table)
    total, unused = sum(e.size for e in found), sum(e.size for e in found if not e.used_by)
    console.print(f"{_size(total)} in all; {_size(unused)} used by no profile "
                  "(`specgen cache prune` removes it).", highlight=False)


def prune_cmd(
    dry_run: bool = False,
) -> None:
    """Remove the entries no bundled or user profile needs (models no profile names, other
    dtypes or schemes, copies made by older releases, interrupted writes)."""
    from specgen.loading import cache_listing

    gone = cache_listing.prune(dry_run=dry_run)
    console = Console()
    for e in gone:
        console.print(f"{'would remove' if dry_run else 'removed'} {e.path} ({_size(e.size)}, "
                      f"{e.kind})", highlight=False)
    verb = "would free" if dry_run else "freed"
    console.print(f"{len(gone)} entries, {verb} {_size(sum(e.size for e in gone))}.", highlight=False)


def verify_cmd(
    delete: bool = False,
) -> None:
    """Rehash every converted and quantized entry in full against the hashes recorded when
    it was made (a load checks sizes and a sample of each file only)."""
    from specgen.loading import cache, cache_listing

    console = Console()
    damaged = []
    for entry, problem in cache_listing.verify():
        if problem is None:
            console.print(f"ok       {entry.path}", highlight=False)
            continue
        if entry.kind == "older":  # never loaded by this release: nothing to verify
            console.print(f"older    {entry.path}: made by an older release, no longer used "
                          "(`specgen cache prune` removes it)", highlight=False)
            continue
        damaged.append(entry)
        console.print(f"[red]damaged[/]  {entry.path}: {problem}", highlight=False)
        if delete:
            cache.remove(entry.path)
    if damaged and not delete:
        raise CacheDamaged(f"{len(damaged)} damaged cache entries: run `specgen cache verify "
                           "--delete` to remove them (the next run rebuilds each from its source).")
    if damaged:
        console.print(f"removed {len(damaged)} damaged entries.", highlight=False)
