"""The model cache's entries: converted and packed copies of models, each a folder that a
load maps as it is, named by what determines its bytes, checked on every load and rebuilt
when damaged (`ensure`). Listing, pruning and verifying it (`specgen cache`) is
cache_listing.py's. No torch here: listings start at once.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specgen.errors import ModelError
from specgen.paths import cache_dir

FORMAT = 2  # of an entry (its manifest and layout)
# Of a tokenizer copy (loading/tokenizer_cache.py): 2 records the plain tokenizer's settings
# and verdict; 3 keeps a GGUF's tokenizer as one entry, the copy itself. A copy of another
# format is never loaded again: it lists as "older".
TOKENIZER_FORMAT = 3
MANIFEST = "specgen.json"
SAMPLES, SAMPLE_BYTES = 64, 1 << 16
SMALL = 1 << 24  # files up to this size are hashed whole on every check
STALE_AFTER = 3600.0  # seconds: a temporary that names no process is left alone this long
FOLDERS = ("converted", "quantized", "demo", "kernels", "tokenizers")


ABSENT = "absent"  # problem_of: no entry at all


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


def entry_for(sha256: str, dtype: str, scheme: str | None) -> Path:
    """The entry of a model with these source weights in this dtype: packed for a CPU
    `scheme`, else the GGUF's converted copy."""
    if scheme is None:
        return converted_dir(sha256, dtype)
    from specgen.kernels import quantize  # torch: only where a load names a packed entry

    return packed_dir(sha256, scheme, dtype, quantize.FORMAT_VERSION, quantize.flavour(scheme))


# --- hashing ----------------------------------------------------------------------------------

HASH_CHUNK = 1 << 24  # 16 MiB reads


def sha256_file(path: Path) -> str:
    """sha256 of a whole file: the manifests, `specgen cache verify`, a GGUF's check against
    its profile's, the demo files' checks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(HASH_CHUNK):
            h.update(block)
    return h.hexdigest()


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
    """The sha256 of a file's contents, hashed once and remembered by its path and stamp in
    `hashes.json` (a file changed since is hashed again)."""
    memo_path = cache_dir() / "hashes.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    real = path.resolve()
    stamp = file_stamp(real)
    known = memo.get(str(real)) if isinstance(memo, dict) else None
    if not known or known[:-1] != stamp:
        memo = memo if isinstance(memo, dict) else {}
        memo[str(real)] = known = [*stamp, sha256_file(real)]
        write_json(memo_path, memo)
    return known[-1]


def file_stamp(path: Path) -> list[int]:
    """What a remembered hash is kept by: a write changes the size or the modification time,
    a file put in its place (a rename, a copy that keeps the time) has another inode, and
    either moves the change time, which no program can set back."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


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


def current(folder: Path) -> dict | None:
    """The manifest of an entry this release made (its format), else None."""
    manifest = read_manifest(folder)
    return manifest if is_current(manifest) else None


def intact(folder: Path) -> dict | None:
    """The manifest of a current entry that passes its check, else None."""
    manifest = current(folder)
    return manifest if manifest is not None and check(folder) is None else None


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


def problem_of(entry: Path) -> str | None:
    """None when the entry is there and intact (sizes and sampled hashes), ABSENT when there
    is nothing, else what is wrong with it."""
    if not entry.exists():
        return ABSENT
    return check(entry)


@dataclass(frozen=True)
class Found:
    """A model's entry (`entry_for`) as checked: `problem` (problem_of) None when it is
    ready to load, ABSENT when there is none, else what is wrong with it (`damaged`)."""

    path: Path
    problem: str | None

    @property
    def ready(self) -> bool:
        return self.problem is None

    @property
    def damaged(self) -> bool:
        return self.problem not in (None, ABSENT)


def lookup(sha256: str, dtype: str, scheme: str | None) -> Found:
    """The entry of a model with these source weights, dtype and scheme, checked."""
    entry = entry_for(sha256, dtype, scheme)
    return Found(entry, problem_of(entry))


def ensure(entry: Path, build: Callable[[Path], dict],
           damaged: Callable[[str], None] | None = None) -> Path:
    """The entry, intact: as found when its check passes, else built afresh (a damaged or
    older one replaced). `build(folder)` writes the entry's files into a temporary folder and
    returns what its manifest records; `damaged(problem)` hears why an entry there is rebuilt."""
    problem = problem_of(entry)
    if problem is None:
        return entry
    if problem != ABSENT and damaged is not None:
        damaged(problem)
    with building(entry) as tmp:
        manifest = build(tmp)
        finish(tmp, **manifest)
    return entry


def finish(folder: Path, **manifest) -> dict:
    """Write the manifest of a built entry (last): what it is, and its files' records."""
    data = {"format": FORMAT, **manifest, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "files": file_records(folder)}
    write_json(folder / MANIFEST, data)
    return data
