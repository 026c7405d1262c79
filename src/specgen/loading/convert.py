"""Building the cache entries a load maps (loading/cache.py): a GGUF dequantised once into
safetensors (`converted/`, keyed by the file's sha256 and the dtype), and a model quantized
once for a CPU scheme (`quantized/`, keyed by the source weights' sha256, the scheme and the
dtype). Each is made through `cache.ensure`: an intact entry is used as it is, a missing or
damaged one is built (in a temporary folder renamed into place)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from specgen.errors import ModelError
from specgen.loading import cache
from specgen.loading.mapped import save_packed
from specgen.loading.plan import dtype_name
from specgen.loading.sources import ModelFiles, Progress, pretrained, say
from specgen.loading.tokenizer_cache import load_tokenizer


def rebuilding(entry: Path, progress: Progress | None) -> Callable[[str], None]:
    """What the user hears when a damaged entry is rebuilt."""
    return lambda problem: say(progress, f"The cached model in {entry} is damaged ({problem}): "
                                         "rebuilding it")


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


def _dequantised(source: ModelFiles, dtype: torch.dtype, trust_remote_code: bool):
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


def convert_gguf(source: ModelFiles, dtype: torch.dtype, trust_remote_code: bool,
                 progress: Progress | None) -> Path:
    """The GGUF's safetensors copy in the cache, dequantised the first time (or when the
    entry is damaged); returns the entry."""
    def build(tmp: Path) -> dict:
        say(progress, f"Converting {source.gguf} to {dtype_name(dtype)} safetensors "
                      "(first run only, about a minute)")
        model, tokenizer = _dequantised(source, dtype, trust_remote_code)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return dict(kind="converted", sha256=source.sha256, dtype=dtype_name(dtype),
                    source=source.gguf, model=source.name)

    entry = cache.converted_dir(source.sha256, dtype_name(dtype))
    return cache.ensure(entry, build, rebuilding(entry, progress))


def _float_model(origin: ModelFiles, dtype: torch.dtype, trust_remote_code: bool,
                 progress: Progress | None):
    """The model of `origin` in memory in `dtype` (a GGUF dequantised), and its tokenizer."""
    if origin.gguf:
        say(progress, f"Reading {origin.gguf} as {dtype_name(dtype)} (first run only, about a minute)")
        return _dequantised(origin, dtype, trust_remote_code)
    try:
        model = pretrained(origin.path, dtype=dtype, trust_remote_code=trust_remote_code,
                           device_map={"": "cpu"})
    except (OSError, ValueError) as e:
        raise ModelError(f"Cannot load {origin.name}: {e}") from None
    return model, load_tokenizer(origin, trust_remote_code)


def pack(source: ModelFiles, origin: ModelFiles, scheme: str, dtype: torch.dtype,
         trust_remote_code: bool, progress: Progress | None) -> Path:
    """The packed model of `source` for the CPU `scheme`, quantized and stored the first time
    from `origin` (the GGUF's converted copy where one is cached, else `source` itself);
    returns the entry. A hub model's weights are downloaded by then (its key is their hash)."""
    from specgen.kernels import quantize

    sha = source.sha256 if source.gguf else cache.weights_sha256(source.path)

    def build(tmp: Path) -> dict:
        model, tokenizer = _float_model(origin, dtype, trust_remote_code, progress)
        say(progress, f"Quantizing {source.name} to {scheme} (first run only)")
        quantize.apply(model, scheme)
        save_packed(model, tmp)
        model.config.save_pretrained(tmp)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return dict(kind="quantized", sha256=sha, dtype=dtype_name(dtype), scheme=scheme,
                    flavour=quantize.flavour(scheme), source=source.gguf or source.name,
                    model=source.name, layers_format=quantize.FORMAT_VERSION)

    entry = cache.entry_for(sha, dtype_name(dtype), scheme)
    return cache.ensure(entry, build, rebuilding(entry, progress))
