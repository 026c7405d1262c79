"""llama.cpp, through `llama-cpp-python` (optional): a draft model's runtime, and a peer in
`specgen bench`.

- As a draft (`runtime = "llama.cpp"` in a profile's [draft]), it runs the GGUF file's own
  quantized weights (e.g. Q4_K_M) with llama.cpp's CPU kernels. A draft pass is one token,
  where those kernels read the fewest bytes; what the draft computes is what q is, so the
  output stays exactly the target's.
- As a peer, it decodes the target's GGUF file greedily with the same kernels, so its tokens
  are that program's greedy output, not necessarily the baseline's."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from specgen.decoding import llamacpp_tools
from specgen.decoding.base import DraftModel
from specgen.errors import ConfigError, ModelError

INSTALL_HINT = ("pip install llama-cpp-python (it compiles llama.cpp: several minutes), or, in a "
                "checkout, `make llamacpp` (llama.cpp built natively, the bindings against it)")


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def version() -> str | None:
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return None


def _bundles_library() -> bool:
    """Whether the installed bindings carry a libllama of their own (a wheel, or pip's build
    from the sdist); `make llamacpp` installs them without one."""
    spec = importlib.util.find_spec("llama_cpp")
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    return any(any((Path(p) / "lib").glob("libllama.*")) for p in places)


# The bindings read LLAMA_CPP_LIB_PATH once, when first imported: set it before anything does,
# so the llamacpp contestant and a llama.cpp draft run `make llamacpp`'s native build.
LIB_PATH = llamacpp_tools.point_bindings(version(), _bundles_library()) if available() else None


def load(gguf: Path, threads: int, n_ctx: int):
    """A llama_cpp.Llama on `gguf`, CPU, `threads` threads, room for `n_ctx` tokens."""
    if not available():
        raise ConfigError(f"The llamacpp contestant needs llama-cpp-python: {INSTALL_HINT}.")
    try:
        from llama_cpp import Llama
    except (OSError, RuntimeError) as e:  # bindings without a library they can find
        raise ConfigError(f"llama-cpp-python cannot load its llama.cpp library ({e}): "
                          f"{INSTALL_HINT}.") from None

    try:
        return Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                     n_gpu_layers=0, verbose=False)
    except ValueError as e:  # llama.cpp says no more than "Failed to load model from file"
        raise ModelError(f"llama.cpp cannot load {gguf} ({e}): its build may not know this "
                         "model's architecture or file version. Update llama-cpp-python, or run "
                         "the model in transformers (draft.runtime = \"transformers\").") from None


# A draft's first cache room, in tokens. llama.cpp allocates (and clears) a context's whole
# cache when it makes it: for a model's whole training context that is most of the draft's
# start. A context that outgrows the room gets a bigger one (`LlamaCppDraft.logits`).
ROOM = 4096


class LlamaCppDraft(DraftModel):
    """A draft model run by llama.cpp, with the interface drafters.ModelDrafter drafts with:
    `logits(ids)`, `crop(length)`, `reset()` and `length`. Its KV cache holds the first
    `length` tokens of the context; cropping only moves that mark, and llama.cpp drops the
    cache entries past it before its next evaluation. `reload(n_ctx)`, where given, makes the
    same model with room for n_ctx tokens: a context that outgrows the room moves to a model
    with twice as much (or more), which reads the tokens held so far again."""

    def __init__(self, llm, reload: Callable[[int], object] | None = None) -> None:
        self.llm, self.reload = llm, reload
        self.vocab_size = self.input_vocab = llm.n_vocab()
        self.eos_token_id = llm.token_eos()

    @property
    def length(self) -> int:
        return self.llm.n_tokens

    def limit(self) -> int:
        """The most positions it takes: its training context where its room can grow."""
        if self.reload is None:
            return self.room()
        import llama_cpp

        return max(self.room(), llama_cpp.llama_model_n_ctx_train(self.llm.model))

    def logits(self, ids: Tensor) -> Tensor:
        """The next token's logits [V] after reading `ids` [T] into the cache."""
        import llama_cpp

        if self.reload is not None and self.length + len(ids) > self.room():
            self._grow(self.length + len(ids))
        self.llm.eval(ids.tolist())
        row = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)  # llama.cpp's buffer: copy it
        return torch.from_numpy(np.ctypeslib.as_array(row, shape=(self.vocab_size,)).copy())

    def room(self) -> int:
        """The tokens its cache holds. llama.cpp may make a cache with more room than asked,
        but the binding keeps the context's token ids for as many as were asked."""
        return min(self.llm.n_ctx(), len(self.llm.input_ids))

    def _grow(self, need: int) -> None:
        held = self.llm.input_ids[:self.length].tolist()
        room = self.room()
        while room < need:
            room *= 2
        bigger = self.reload(room)  # where it fails, the draft keeps the room it had
        if held:
            bigger.eval(held)
        self.llm = bigger

    def crop(self, length: int) -> None:
        self.llm.n_tokens = min(self.llm.n_tokens, length)

    def reset(self) -> None:
        self.llm.reset()


def load_draft(gguf: Path, threads: int, room: int = ROOM) -> LlamaCppDraft:
    """A LlamaCppDraft on `gguf` with a cache for `room` tokens, grown when a context outgrows
    it (the target's context limits the answer, never the draft's cache)."""
    reload = functools.partial(load, gguf, threads)
    return LlamaCppDraft(reload(room), reload)


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
