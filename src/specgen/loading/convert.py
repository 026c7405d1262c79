"""The conversion cache: a GGUF file is checked against its sha256 and dequantised once into
safetensors in the cache (keyed by the file's sha256 and the dtype); later loads read that
copy. `locate` resolves a model entry to the files a load reads, preferring that copy."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from specgen.errors import ModelError
from specgen.loading import demo
from specgen.loading.devices import dtype_name
from specgen.loading.sources import Progress, Source, find, is_gguf, load_tokenizer, say
from specgen.paths import cache_dir
from specgen.profiles import ModelSpec


def locate(spec: ModelSpec, role: str, dtype: torch.dtype, progress: Progress | None = None,
           base: Path | None = None) -> Source:
    """Resolve a model entry to files on disk: a GGUF's converted copy when cached (found by
    the declared sha256, so neither hub nor demo packages are needed), else the GGUF file
    (downloaded or assembled, sha256 verified); for a hub model its config and tokenizer
    only, the weights come later in `fetch_weights`."""
    name = spec.model
    if is_gguf(spec) and spec.sha256 and is_complete(converted_dir(spec.sha256, dtype), spec.sha256, dtype):
        return Source(name, converted_dir(spec.sha256, dtype))
    source = find(spec, role, progress, base)
    if source.gguf:
        verify_gguf(source, dtype, progress)
    return source


def locate_gguf(spec: ModelSpec, role: str, progress: Progress | None = None,
                base: Path | None = None) -> Source:
    """The GGUF file itself (found, assembled or downloaded; sha256 checked), never a
    converted copy: for llama.cpp, which reads it."""
    source = find(spec, role, progress, base)
    check_sha256(source, progress)
    return source


def converted_dir(sha256: str, dtype: torch.dtype) -> Path:
    return cache_dir() / "converted" / f"{sha256[:16]}-{dtype_name(dtype)}"


def verify_gguf(source: Source, dtype: torch.dtype, progress: Progress | None) -> None:
    """Check the file's sha256, then point `source` at the converted copy when one is cached
    for this file and dtype."""
    check_sha256(source, progress)
    converted = converted_dir(source.sha256, dtype)
    if is_complete(converted, source.sha256, dtype):
        source.path, source.gguf = converted, None


def check_sha256(source: Source, progress: Progress | None = None) -> None:
    """Check a GGUF source's sha256 against the profile's when given: it is about to be trusted."""
    if not source.verified:
        declared, file = source.sha256, source.path / source.gguf
        say(progress, f"Checking the sha256 of {source.gguf}")
        actual = demo.sha256_file(file)
        if declared and actual != declared:
            raise ModelError(
                f"Refusing {file}: its sha256 is {actual}, the profile expects {declared}. The "
                "file is damaged or not the one the profile names: delete it and download it "
                "again (or, if the upstream file really changed, update sha256 in the profile).")
        source.sha256, source.verified = actual, True


def is_complete(folder: Path, sha256: str, dtype: torch.dtype) -> bool:
    """A converted copy counts only if its marker (written last) matches; anything else is
    stale or half-written and gets rebuilt."""
    try:
        mark = json.loads((folder / "specgen.json").read_text())
    except (OSError, ValueError):
        return False
    return (mark.get("sha256") == sha256 and mark.get("dtype") == dtype_name(dtype)
            and (folder / "config.json").is_file())


def convert_gguf(source: Source, dtype: torch.dtype, trust_remote_code: bool,
                  progress: Progress | None) -> None:
    """Dequantise a GGUF into a safetensors copy in the cache. Written to a temporary folder
    and renamed, so a crash never leaves a copy that counts."""
    from transformers import GgufConfig

    out = converted_dir(source.sha256, dtype)
    say(progress, f"Converting {source.gguf} to {dtype_name(dtype)} safetensors "
                   "(first run only, about a minute)")
    model = AutoModelForCausalLM.from_pretrained(
        source.path, gguf_file=source.gguf, dtype=dtype, trust_remote_code=trust_remote_code,
        quantization_config=GgufConfig(dequantize=True))
    tokenizer = load_tokenizer(source, trust_remote_code)
    # A GGUF-loaded model refuses save_pretrained while it still carries the GGUF quantizer.
    model.config.quantization_config = None
    model.hf_quantizer = None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        mark = {"sha256": source.sha256, "dtype": dtype_name(dtype), "source": source.gguf}
        (tmp / "specgen.json").write_text(json.dumps(mark))
        del model
        if out.exists():
            shutil.rmtree(out)  # stale or corrupt: it did not pass _is_complete
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
