"""`specgen profiles list | show NAME | validate FILE | check`: plain functions of the parsed
options (cli/profiles.py declares them)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specgen.choices import HEAD_KINDS
from specgen.errors import SpecgenError
from specgen.profiles import (DEFAULT_PROFILE, Profile, bundled_profile_dir, list_profiles,
                              load_profile, user_profile_dir)

def _where(path: Path | None) -> str:
    if path is None:
        return "-"
    if path.parent.resolve() == bundled_profile_dir().resolve():
        return "bundled"
    return str(path)


def _memory(profile: Profile) -> str:
    from specgen.loading.memory import profile_rough_bytes

    n = profile_rough_bytes(profile)
    return "?" if n is None else f"~{n / 1e9:.0f} GB" if n >= 10e9 else f"~{n / 1e9:.1f} GB"


def list_cmd() -> None:
    """All profiles: the user's (which shadow bundled ones of the same name), then bundled."""
    table = Table(title="specgen profiles")
    for col in ("name", "target", "draft", "quantization", "memory", "file"):
        table.add_column(col, overflow="fold")
    for name, path in list_profiles():
        try:
            p = load_profile(str(path))
        except SpecgenError as e:
            table.add_row(name, f"[red]invalid: {escape(str(e))}[/]", "", "", "", _where(path))
            continue
        draft = p.draft.model if p.draft and p.speculation.method != "prompt-lookup" else "-"
        drafted = "GGUF in llama.cpp" if p.draft and p.draft.runtime == "llama.cpp" else (
            p.draft.quantization if p.draft else "")
        quant = p.target.quantization + (f" / {drafted}" if p.draft else "")
        if p.speculation.method in HEAD_KINDS:  # a head on the target drafts
            draft, quant = f"{p.draft.kind} head {p.draft.head}", p.target.quantization
        label = f"{name} (default)" if name == DEFAULT_PROFILE else name
        table.add_row(label, p.target.model, draft, quant, _memory(p), _where(path))
    # A console per command, not per module: its width follows $COLUMNS at call time.
    console = Console()
    console.print(table)
    console.print(f"User profiles go in {user_profile_dir()} (or $SPECGEN_PROFILE_DIR).",
                  highlight=False)


def show_cmd(name: str = DEFAULT_PROFILE) -> None:
    """The resolved profile (after `extends` and defaults), as TOML."""
    p = load_profile(name)
    console = Console()
    console.print(f"# {p.name}  ({_where(p.path)})", highlight=False)
    console.print(to_toml(p.to_dict()), highlight=False, markup=False, soft_wrap=True)


def validate_cmd(file: Path) -> None:
    """Check a profile file: syntax, keys, types and allowed values."""
    p = load_profile(str(file) if str(file).endswith(".toml") or "/" in str(file) else f"./{file}")
    draft = f", draft {p.draft.model}" if p.draft and p.draft.has_model else ""
    draft += f", {p.draft.kind} head {p.draft.head}" if p.draft and p.draft.head else ""
    Console().print(f"ok: {file} is a valid profile (target {p.target.model}{draft})", highlight=False)


def check_cmd() -> None:
    """Check every profile found (bundled and yours): one line each; exit 2 if any is invalid."""
    console, bad = Console(), 0
    found = list_profiles()
    for name, path in found:
        try:
            load_profile(str(path))
        except SpecgenError as e:
            bad += 1
            console.print(f"[red]invalid[/] {name} ({_where(path)}): {escape(str(e))}", highlight=False)
            continue
        console.print(f"ok {name} ({_where(path)})", highlight=False)
    if not found:
        raise SpecgenError(f"No profiles found: the bundled ones should be in {bundled_profile_dir()}; "
                           f"reinstall specgen.")
    if bad:
        raise SpecgenError(f"{bad} of {len(found)} profiles are invalid (above); fix or remove them.")


def to_toml(data: dict) -> str:
    """Profiles hold only flat tables of strings, numbers and booleans."""
    lines = [f"{k} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for section, table in data.items():
        if isinstance(table, dict):
            lines += ["", f"[{section}]"] + [f"{k} = {_value(v)}" for k, v in table.items()]
    return "\n".join(lines)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):  # a TOML basic string: JSON's escapes, and DEL escaped too
        return json.dumps(v).replace("\x7f", "\\u007f")
    return repr(v)
