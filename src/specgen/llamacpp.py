"""llama.cpp's plain greedy decoding of the target's GGUF file, as a peer in `specgen bench`.

Optional: used only when `llama-cpp-python` is installed and the target is a GGUF model. It
decodes the same quantized weights with llama.cpp's own kernels, so its tokens are that
program's greedy output, not necessarily the baseline's."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import time
from collections.abc import Sequence
from pathlib import Path

from specgen.errors import ConfigError

INSTALL_HINT = "pip install llama-cpp-python (it compiles llama.cpp: several minutes)"


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def version() -> str | None:
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return None


def load(gguf: Path, threads: int, n_ctx: int):
    """A llama_cpp.Llama on `gguf`, CPU, `threads` threads, room for `n_ctx` tokens."""
    if not available():
        raise ConfigError(f"The llamacpp contestant needs llama-cpp-python: {INSTALL_HINT}.")
    from llama_cpp import Llama

    return Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                 n_gpu_layers=0, verbose=False)


def generate(llm, input_ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int]
             ) -> tuple[list[int], float, float]:
    """Greedy tokens after `input_ids`, with (seconds to the first token, seconds in all).
    The state is reset first, so no prompt prefix is reused from an earlier call."""
    llm.reset()
    tokens: list[int] = []
    start = time.perf_counter()
    first = None
    for token in llm.generate(list(input_ids), top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                              repeat_penalty=1.0, reset=True):
        if first is None:
            first = time.perf_counter() - start
        tokens.append(int(token))
        if token in eos_ids or len(tokens) >= max_new_tokens:
            break
    return tokens, first or 0.0, time.perf_counter() - start
