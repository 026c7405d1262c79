"""The model cache: converted and packed copies of models, each a folder that a load maps
as it is, checked on every load and rebuilt when damaged; listing, pruning and verifying
it (`specgen cache`). No torch here: listings start at once.

Under `paths.cache_dir()`:

| folder | an entry | keyed by |
|---|---|---|
| `converted/` | a GGUF dequantised to safetensors, transformers' layout | the GGUF's sha256, the dtype |
| `quantized/` | a model with its linear layers packed for a CPU scheme, every tensor in one safetensors file | the source weights' sha256, the scheme, the dtype, the format (and the kernel build, for int4-wo) |
| `demo/` | the demo GGUF files assembled from their packages | their sha256 |
| `kernels/` | compiled C kernels | their sources' hash |
| `tokenizers/` | a model's tokenizer saved for the fast load (loading/tokenizer_cache.py) | its files' bytes, the transformers and tokenizers versions |

An entry's name comes from what determines its bytes, never from paths or times, so every
install on the machine shares it. Its manifest, `specgen.json`, is written last, into a
temporary folder renamed into place: a folder without one is not an entry. The manifest
records each file's size, a sampled hash (64 blocks of 64 KiB spread over the file, or the
whole file when small) and its full sha256. A load checks the sizes and the sampled hashes
(a few MB read); `specgen cache verify` rehashes everything.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from specgen.errors import ModelError
from specgen.loading.hashing import sha256_file
from specgen.paths import cache_dir

FORMAT = 2  # of an entry (its manifest and layout)
# Of a tokenizer copy (loading/tokenizer_cache.py): 2 records the plain tokenizer's settings
# and verdict. A copy of another format is never loaded again: it lists as "older".
TOKENIZER_FORMAT = 2
MANIFEST = "specgen.json"
SAMPLES, SAMPLE_BYTES = 64, 1 << 16
SMALL = 1 << 24  # files up to this size are hashed whole on every check
STALE_AFTER = 3600.0  # seconds: a temporary that names no process is left alone this long
FOLDERS = ("converted", "quantized", "demo", "kernels", "tokenizers")


class DamagedCache(ModelError):
    """A cached copy failed its check and could not be rebuilt."""


# --- names ------------------------------------------------------------------------------------

def converted_dir(sha256: str, dtype: str) -> Path:
    """A GGUF's dequantised copy (the name older releases used too: an older entry, whose
    manifest records no files, is rebuilt once)."""
    return cache_dir() / "converted" / f"{sha256[:16]}-{dtype}"


def packed_dir(weights_sha256: str, scheme: str, dtype: str, layers_format: int,
               flavour: str = "") -> Path:
    """A packed model: one per source weights, scheme, dtype, format of the entry and of its
    packed layers (kernels.quantize.FORMAT_VERSION), and kernel build where the scheme's
    bytes depend on it (kernels.quantize.flavour)."""
    key = f"{weights_sha256}|{scheme}|{dtype}|{flavour}|v{FORMAT}.{layers_format}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return cache_dir() / "quantized" / f"{scheme}-{dtype}-{digest}"


# --- hashing ----------------------------------------------------------------------------------

def sampled_hash(path: Path) -> str:
    """sha256 of the size and SAMPLES blocks spread evenly over the file (the whole file
    when small): cheap enough for every load, and it sees a file overwritten anywhere in a
    stretch longer than the gap between blocks (about 1/63 of the file)."""
    size = path.stat().st_size
    if size <= SMALL:
        return sha256_file(path)
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        for i in range(SAMPLES):
            f.seek((size - SAMPLE_BYTES) * i // (SAMPLES - 1))
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def file_records(folder: Path) -> dict[str, dict]:
    """Size, sampled hash and full sha256 of every file in `folder` but the manifest."""
    records = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        records[path.relative_to(folder).as_posix()] = {
            "size": path.stat().st_size, "sample": sampled_hash(path), "sha256": sha256_file(path)}
    return records


def weights_sha256(folder: Path) -> str:
    """One sha256 for a model folder's weight files (safetensors, else .bin), from their
    contents: a hub download's blob names are their sha256 already; other files are hashed
    once and remembered by path, size and time in `hashes.json` (only to skip hashing again:
    the key itself is the content's)."""
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if not files:
        raise ModelError(f"{folder} holds no weights (*.safetensors or *.bin).")
    parts = []
    for f in files:
        real = f.resolve()
        if re.fullmatch(r"[0-9a-f]{64}", real.name):  # huggingface_hub's blobs/<sha256>
            parts.append(f"{f.name}:{real.name}")
        else:
            parts.append(f"{f.name}:{remembered_sha256(real)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def remembered_sha256(path: Path) -> str:
    """The sha256 of a file's contents, hashed once and remembered by its path, size and time
    in `hashes.json` (a file changed since is hashed again)."""
    memo_path = cache_dir() / "hashes.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    real = path.resolve()
    st = real.stat()
    stamp = [st.st_size, st.st_mtime_ns]
    known = memo.get(str(real)) if isinstance(memo, dict) else None
    if not known or known[:2] != stamp:
        memo = memo if isinstance(memo, dict) else {}
        memo[str(real)] = known = [*stamp, sha256_file(real)]
        write_json(memo_path, memo)
    return known[2]


# --- manifests and checks -----------------------------------------------------------------------

def write_json(path: Path, data: dict) -> None:
    """Atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_manifest(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_current(manifest: dict | None) -> bool:
    return bool(manifest) and manifest.get("format") == FORMAT and isinstance(manifest.get("files"), dict)


def check(folder: Path, full: bool = False) -> str | None:
    """What is wrong with an entry (None when intact): a missing or older manifest, a file
    missing or of another size, or a hash that differs (the sampled one; with `full`, the
    whole file's)."""
    manifest = read_manifest(folder)
    if manifest is None:
        return "it has no manifest"
    if not is_current(manifest):
        return "it was made by an older release"
    for name, record in manifest["files"].items():
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != record["size"]:
            return f"{name} is {size:,} bytes, expected {record['size']:,}"
        if full:
            if sha256_file(path) != record["sha256"]:
                return f"the contents of {name} changed"
        elif sampled_hash(path) != record["sample"]:
            return f"the contents of {name} changed"
    return None


# --- building an entry ---------------------------------------------------------------------------

def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


TEMP = re.compile(r"^\..+\.(?:tmp|old)-(\d+)-[0-9a-f]+$")
LEGACY_TEMP = re.compile(r"^\..+(?:\.(\d+)\.tmp|\.part|\.[a-z0-9_]{8})$")  # older releases'


def is_stale(path: Path) -> bool:
    """A temporary left by a process that is gone: ours name their process; older
    releases' (mkdtemp, mkstemp) do not, and count as stale after STALE_AFTER."""
    m = TEMP.match(path.name)
    if m:
        return not _pid_alive(int(m.group(1)))
    m = LEGACY_TEMP.match(path.name)
    if not m:
        return False
    if m.group(1):
        return not _pid_alive(int(m.group(1)))
    try:
        return time.time() - path.lstat().st_mtime > STALE_AFTER
    except OSError:
        return False


def sweep(folder: Path) -> list[Path]:
    """Remove the stale temporaries in `folder` (interrupted conversions and writes);
    returns what was removed."""
    removed = []
    try:
        children = list(folder.iterdir())
    except OSError:
        return removed
    for child in children:
        if child.name.startswith(".") and is_stale(child):
            remove(child)
            removed.append(child)
    return removed


def remove(path: Path) -> None:
    """A file or a folder, whichever it is."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def terminate_raises() -> Iterator[None]:
    """While inside, SIGTERM raises SystemExit(143) (so `finally` blocks run) where nobody
    else handles it yet; a handler already installed (the CLI's) is left as it is."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def building(final: Path) -> Iterator[Path]:
    """A temporary folder beside `final` to write an entry into; `finish` it inside the
    block. On leaving normally it replaces `final`; on any exception or signal it is
    removed, so an interrupted build leaves nothing behind. Stale temporaries of earlier
    builds are removed first."""
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep(final.parent)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with terminate_raises():
            tmp.mkdir()
            yield tmp
            if not (tmp / MANIFEST).is_file():
                raise RuntimeError(f"building {final.name}: finish() was not called")
            if final.exists():  # damaged or older: out of the way first, then gone
                old = final.with_name(f".{final.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
                os.replace(final, old)
                remove(old)
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            remove(tmp)


def finish(folder: Path, **manifest) -> dict:
    """Write the manifest of a built entry (last): what it is, and its files' records."""
    data = {"format": FORMAT, **manifest, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "files": file_records(folder)}
    write_json(folder / MANIFEST, data)
    return data


# --- listing and pruning ---------------------------------------------------------------------------

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
