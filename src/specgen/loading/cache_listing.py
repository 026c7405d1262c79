"""What the model cache holds (loading/cache.py's entries, demo files, kernels, tokenizer
copies), which profiles use each, and `specgen cache`'s listing, pruning and verifying; the
read-ahead of the entries a profile will map. No torch here: listings start at once."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from specgen.loading.cache import (FOLDERS, TOKENIZER_FORMAT, check, is_current, is_stale,
                                   read_manifest, remove)
from specgen.paths import cache_dir


@dataclass
class Entry:
    path: Path
    kind: str  # converted, quantized, demo, kernel, tokenizer, older (made by an older release), temporary
    size: int
    manifest: dict | None = None
    used_by: list[str] = field(default_factory=list)

    @property
    def what(self) -> str:
        m = self.manifest or {}
        if self.kind == "converted":
            return f"{m.get('source', '?')} as {m.get('dtype', '?')}"
        if self.kind == "quantized":
            return f"{m.get('source', '?')} in {m.get('scheme', '?')} ({m.get('dtype', '?')})"
        if self.kind == "tokenizer":
            return f"the tokenizer of {Path(m.get('source', '?')).name}" + ("" if m.get("same") else
                                                                           " (refused: loads as it is)")
        return "-"


def _size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())


def _children(root: Path, folders: tuple[str, ...]) -> Iterator[tuple[str, Path]]:
    """(folder, child) for everything in each of the cache's `folders` that can be listed,
    in name order (a folder missing or unreadable lists nothing)."""
    for folder in folders:
        try:
            children = sorted((root / folder).iterdir())
        except OSError:
            continue
        for child in children:
            yield folder, child


def entries(root: Path | None = None) -> list[Entry]:
    """Everything in the cache, with sizes, and which profiles use each entry."""
    found = []
    for folder, child in _children(root or cache_dir(), FOLDERS):
        if child.name.startswith("."):
            kind = "temporary"
            manifest = None
        elif folder in ("converted", "quantized", "tokenizers"):
            manifest = read_manifest(child)
            kind = ("tokenizer" if folder == "tokenizers" else folder) if is_current(manifest) else "older"
            if kind == "tokenizer" and manifest.get("tokenizer_format") != TOKENIZER_FORMAT:
                kind = "older"
        else:
            kind, manifest = ("kernel" if folder == "kernels" else "demo"), None
        found.append(Entry(child, kind, _size(child), manifest))
    _mark_users(found)
    return found


def _dtypes(spec) -> set[str]:
    """The dtypes a model entry may resolve to: "auto" is this CPU's choice, and bf16 or fp16
    where it may run on an NVIDIA GPU (named, or "auto" on a machine with the driver)."""
    from specgen.loading.devices import cpu_has_bf16

    if spec.dtype != "auto":
        return {spec.dtype}
    out = {"bfloat16" if cpu_has_bf16() else "float32"}
    if spec.device.startswith("cuda") or (spec.device == "auto" and Path("/proc/driver/nvidia").exists()):
        out |= {"bfloat16", "float16"}
    return out


def _wants(profile) -> list[tuple[str, dict]]:
    """(what, criteria) for each cache entry the profile's models may load."""
    from specgen.choices import CPU_SCHEMES, MODEL_METHODS

    specs = [profile.target]
    if (profile.draft is not None and profile.draft.has_model
            and profile.speculation.method in MODEL_METHODS):
        specs.append(profile.draft)
    wants = []
    for spec in specs:
        source = {"sha256": spec.sha256} if spec.sha256 else {"model": spec.model}
        kind = "quantized" if spec.quantization in CPU_SCHEMES else "converted"
        for dtype in _dtypes(spec):
            crit = {**source, "dtype": dtype}
            if kind == "quantized":
                crit["scheme"] = spec.quantization
            wants.append((kind, crit))
        if spec.sha256:
            wants.append(("demo", {"sha256": spec.sha256}))
    return wants


def _matches(entry: Entry, kind: str, crit: dict) -> bool:
    if entry.kind != kind:
        return False
    if kind == "demo":
        from specgen.loading import demo

        asset = next((a for a in demo.ASSETS if a.filename == entry.path.name), None)
        return asset is not None and asset.sha256 == crit["sha256"]
    m = entry.manifest or {}
    return all(m.get(k) == v for k, v in crit.items())


def _mark_users(found: list[Entry]) -> None:
    from specgen.profiles import list_profiles, load_profile

    for name, _ in list_profiles():
        try:
            profile = load_profile(name)
        except Exception:  # a broken user profile needs nothing and must not stop a listing
            continue
        for kind, crit in _wants(profile):
            for entry in found:
                if _matches(entry, kind, crit) and name not in entry.used_by:
                    entry.used_by.append(name)
    by_path = {entry.path.resolve(): entry for entry in found}
    for entry in found:
        if entry.kind == "kernel":
            entry.used_by.append("(kernels)")
        elif entry.kind == "tokenizer":  # used while the model it was made from is
            source = (entry.manifest or {}).get("source", "")
            model = by_path.get(Path(source).resolve()) if source else None
            if model is not None:
                entry.used_by.extend(model.used_by)
            elif source and not Path(source).is_relative_to(cache_dir()) and Path(source).exists():
                entry.used_by.append("(a hub model)")


def prune(dry_run: bool = False, root: Path | None = None) -> list[Entry]:
    """Remove what no bundled or user profile needs: entries of models no profile names,
    entries made by older releases, stale temporaries. Compiled kernels stay (they are
    small and shared by every profile). Returns what was (or would be) removed."""
    gone = []
    for entry in entries(root):
        if entry.kind == "temporary" and not is_stale(entry.path):
            continue  # another process is writing it now
        if entry.used_by:
            continue
        gone.append(entry)
        if not dry_run:
            remove(entry.path)
    return gone


def profile_entries(profile, root: Path | None = None) -> list[Path]:
    """The converted and quantized entries (current ones) the profile's models may load:
    read from the manifests alone, with no torch and no other profile."""
    wants = [(k, c) for k, c in _wants(profile) if k != "demo"]
    found = []
    for folder, child in _children(root or cache_dir(), ("converted", "quantized")):
        if child.name.startswith("."):
            continue
        manifest = read_manifest(child)
        if is_current(manifest) and any(
                _matches(Entry(child, folder, 0, manifest), k, c) for k, c in wants):
            found.append(child)
    return found


def prefetch(profile) -> threading.Thread | None:
    """Ask the kernel to read the weight files the profile will map, in a background thread,
    while Python imports torch and transformers: on a cold page cache the first pass then
    finds its weights in memory instead of faulting them in from disk page by page."""
    if not hasattr(os, "posix_fadvise"):
        return None
    try:
        files = [entry / name for entry in profile_entries(profile)
                 for name in (read_manifest(entry) or {}).get("files", {}) if name.endswith(".safetensors")]
    except Exception:  # only a hint: never in the way of the run
        return None

    def read_ahead() -> None:
        for path in files:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(fd)

    thread = threading.Thread(target=read_ahead, name="specgen-prefetch", daemon=True)
    thread.start()
    return thread


def verify(root: Path | None = None) -> list[tuple[Entry, str | None]]:
    """Every converted, quantized and tokenizer entry rehashed in full: (entry, problem or None)."""
    return [(e, check(e.path, full=True)) for e in entries(root)
            if e.kind in ("converted", "quantized", "tokenizer", "older")]
