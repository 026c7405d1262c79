"""From a model's files to the cache entries a load maps (loading/cache.py): a GGUF checked
against its sha256 and dequantised once into safetensors (`converted/`, keyed by the file's
sha256 and the dtype), and a model quantized once for a CPU scheme (`quantized/`, keyed by
the source weights' sha256, the scheme and the dtype). `locate` resolves a model entry to
the files a load reads, preferring an intact cache entry; a damaged one is rebuilt from its
verified source, or refused when the source cannot be found."""

from __future__ import annotations

from pathlib import Path

import torch

from specgen.choices import CPU_SCHEMES
from specgen.errors import ModelError
from specgen.loading import cache, demo
from specgen.loading.devices import dtype_name
from specgen.loading.sources import (Progress, Source, fetch_weights, find, is_gguf,
                                     load_tokenizer, pretrained, say)
from specgen.profiles import ModelSpec

ABSENT = "absent"


def entry_for(sha256: str, dtype: torch.dtype, scheme: str | None) -> Path:
    """The cache entry of a model with these source weights: packed for a CPU `scheme`,
    else the converted copy."""
    if scheme is None:
        return cache.converted_dir(sha256, dtype_name(dtype))
    from specgen.kernels import quantize

    return cache.packed_dir(sha256, scheme, dtype_name(dtype), quantize.FORMAT_VERSION,
                            quantize.flavour(scheme))


def problem_of(entry: Path) -> str | None:
    """None when the entry is there and intact (sizes and sampled hashes), ABSENT when there
    is nothing, else what is wrong with it."""
    if not entry.exists():
        return ABSENT
    return cache.check(entry)


def _cpu_scheme(spec: ModelSpec) -> str | None:
    return spec.quantization if spec.quantization in CPU_SCHEMES else None


def locate(spec: ModelSpec, role: str, dtype: torch.dtype, progress: Progress | None = None,
           base: Path | None = None) -> Source:
    """Resolve a model entry to files on disk: its intact cache entry (a packed model for a
    CPU scheme, else a GGUF's converted copy; found by the declared sha256, so neither hub
    nor demo packages are needed), else the GGUF file (downloaded or assembled, sha256
    verified); for a hub model its config and tokenizer only, the weights come later in
    `fetch_weights`. A damaged entry is rebuilt when the model's source can be found, and
    refused with one line naming its folder when not."""
    scheme = _cpu_scheme(spec)
    damaged: tuple[Path, str] | None = None
    if is_gguf(spec) and spec.sha256:
        entry = entry_for(spec.sha256, dtype, scheme)
        problem = problem_of(entry)
        if problem is None:
            return Source(spec.model, entry, sha256=spec.sha256, verified=True, packed=bool(scheme))
        if problem != ABSENT:
            damaged = (entry, problem)
    try:
        source = find(spec, role, progress, base)
        if source.gguf:
            check_sha256(source, progress)
    except ModelError as e:
        if damaged is None:
            raise
        raise cache.DamagedCache(
            f"The cached model in {damaged[0]} is damaged ({damaged[1]}) and its source cannot "
            f"be found to rebuild it ({e}) Delete that folder and make the source available "
            "again.") from None
    if source.gguf:
        entry = entry_for(source.sha256, dtype, scheme)
        problem = problem_of(entry)
        if problem is None:
            return Source(source.name, entry, sha256=source.sha256, verified=True,
                          packed=bool(scheme))
        if problem != ABSENT:
            say(progress, f"The cached model in {entry} is damaged ({problem}): rebuilding it "
                          f"from {source.gguf}")
    elif scheme and source.repo is None:  # a local folder: its weights are here to hash
        entry = entry_for(cache.weights_sha256(source.path), dtype, scheme)
        if problem_of(entry) is None:
            return Source(source.name, entry, packed=True)
    return source


def locate_gguf(spec: ModelSpec, role: str, progress: Progress | None = None,
                base: Path | None = None) -> Source:
    """The GGUF file itself (found, assembled or downloaded; sha256 checked), never a
    converted copy: for llama.cpp, which reads it."""
    source = find(spec, role, progress, base)
    check_sha256(source, progress)
    return source


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


def _quiet_gguf_progress() -> None:
    """transformers' GGUF reader draws its own tqdm bar (not behind disable_progress_bar)
    beside specgen's status line: silence it. Here, not at start-up: importing the reader
    costs every run that converts nothing."""
    import functools

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # no gguf package: from_pretrained says so itself
        return
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None and not isinstance(bar, functools.partial):
        gguf_utils.tqdm = functools.partial(bar, disable=True)


def _dequantised(source: Source, dtype: torch.dtype, trust_remote_code: bool):
    """The GGUF's model dequantised in memory, and its tokenizer."""
    from transformers import GgufConfig

    _quiet_gguf_progress()

    model = pretrained(
        source.path, gguf_file=source.gguf, dtype=dtype, trust_remote_code=trust_remote_code,
        quantization_config=GgufConfig(dequantize=True))
    tokenizer = load_tokenizer(source, trust_remote_code)
    # A GGUF-loaded model refuses save_pretrained while it still carries the GGUF quantizer.
    model.config.quantization_config = None
    model.hf_quantizer = None
    return model, tokenizer


def convert_gguf(source: Source, dtype: torch.dtype, trust_remote_code: bool,
                 progress: Progress | None) -> Path:
    """Dequantise a GGUF into a safetensors copy in the cache (written to a temporary folder
    and renamed: an interrupted conversion leaves nothing behind); returns the entry."""
    out = cache.converted_dir(source.sha256, dtype_name(dtype))
    say(progress, f"Converting {source.gguf} to {dtype_name(dtype)} safetensors "
                  "(first run only, about a minute)")
    model, tokenizer = _dequantised(source, dtype, trust_remote_code)
    with cache.building(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del model
        cache.finish(tmp, kind="converted", sha256=source.sha256, dtype=dtype_name(dtype),
                     source=source.gguf, model=source.name)
    return out


def ensure_packed(source: Source, spec: ModelSpec, dtype: torch.dtype,
                  progress: Progress | None = None) -> Path:
    """The packed model of `source` for the entry's CPU scheme, quantized and stored the
    first time (from a converted copy of this dtype when one is cached, else from the GGUF
    or the model's folder): the cache entry's folder."""
    from specgen.kernels import quantize
    from specgen.loading import packed

    scheme = spec.quantization
    fetch_weights(source, progress)
    sha = source.sha256 if source.gguf else cache.weights_sha256(source.path)
    entry = entry_for(sha, dtype, scheme)
    problem = problem_of(entry)
    if problem is None:
        return entry
    if problem != ABSENT:
        say(progress, f"The cached model in {entry} is damaged ({problem}): rebuilding it")
    converted = cache.converted_dir(sha, dtype_name(dtype)) if source.gguf else None
    if converted is not None and problem_of(converted) is None:
        folder = Source(source.name, converted)
    elif source.gguf:
        folder = None
    else:
        folder = source
    if folder is None:
        say(progress, f"Reading {source.gguf} as {dtype_name(dtype)} (first run only, about a minute)")
        model, tokenizer = _dequantised(source, dtype, spec.trust_remote_code)
    else:
        try:
            model = pretrained(
                folder.path, dtype=dtype, trust_remote_code=spec.trust_remote_code,
                device_map={"": "cpu"})
        except (OSError, ValueError) as e:
            raise ModelError(f"Cannot load {source.name}: {e}") from None
        tokenizer = load_tokenizer(folder, spec.trust_remote_code)
    say(progress, f"Quantizing {source.name} to {scheme} (first run only)")
    quantize.apply(model, scheme)
    with cache.building(entry) as tmp:
        packed.save(model, tmp)
        model.config.save_pretrained(tmp)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        del model
        cache.finish(tmp, kind="quantized", sha256=sha, dtype=dtype_name(dtype), scheme=scheme,
                     flavour=quantize.flavour(scheme), source=source.gguf or source.name,
                     model=source.name, layers_format=quantize.FORMAT_VERSION)
    return entry
