"""The lean decoder's design on a GPU: a Llama-family model's layers called directly over a
static, preallocated KV cache, with the forward of each small width replayed from a CUDA graph.

On a GPU a batch-1 step is bound by the host (Python, transformers' generic forward, hundreds
of kernel launches) long before it is bound by the card, which streams a small model's weights
in a millisecond. A captured graph replays every launch of a pass as one, so the host's cost of
a pass no longer depends on the model's depth. What makes a pass capturable:

- the KV cache is one tensor [layers, 2, 1, kv_heads, capacity, head_dim], allocated before any
  capture and never moved while graphs exist (rollback is a length, as in lean.py);
- the position of the first new token lives on the device (`pos`), so the same graph serves
  every position: rotary angles, cache slots (`index_copy_`) and the attention mask are computed
  from it inside the graph;
- a captured pass attends over the whole capacity with a mask (its shapes never depend on the
  cached length), with the query heads that share a key/value head stacked into one (so that
  CUDA's memory-efficient kernel takes the mask, which it does not with `enable_gqa`).

One graph per (width, output rows, head, skip set), captured on first use: width 1 for drafting
and plain decoding, 2..K+1 for verification and for a draft catching up. Wider passes (a
prompt) run eagerly. Graph inputs are copied into static buffers; outputs are cloned, so a
result stays valid after the next pass. The decoder itself never waits for the device: the host
knows the length, and the device learns it through a fill kernel.

Without graphs (on a CPU, or where capture fails) the same code runs eagerly and attends over
exactly the cached positions as transformers does, which tests/test_cuda_decoder.py checks bit
for bit against transformers' forward in fp32; the captured form (whole capacity, masked) is
checked on the CPU against it within rounding.

A pass may leave out sub-layers (`skip`, lean.run_layers): a self-drafting target runs its own
layers with some skipped over its own cache; the verify pass rewrites every entry it drafted.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from specgen.choices import MAX_K
from specgen.decoding.capture import Capture
from specgen.decoding.lean import NO_SKIP, Skip, layer_projections, run_layers
from specgen.models.llama import apply_rotary_pos_emb

if TYPE_CHECKING:
    from transformers import PreTrainedModel

GRAPH_WIDTH = MAX_K + 1  # the widest pass replayed from a graph: a verify pass of MAX_K drafts
FIRST_CAPACITY = 256  # positions; the cache grows by doubling, in multiples of this


def on_one_gpu(model: PreTrainedModel) -> bool:
    """Whether the whole model sits on one CUDA device (not spread over several)."""
    if model.device.type != "cuda":
        return False
    placement = getattr(model, "hf_device_map", None) or {}
    return len({str(d) for d in placement.values()}) <= 1


class CudaDecoder:
    """A Llama-family model over a static KV cache, each small width replayed from a CUDA
    graph (`graphs`, default: on a CUDA device). Answers hidden, logits, crop, reset, length,
    and `reserve(positions)` so that a generation's cache is allocated before any capture.

    `static` (default: `graphs`): passes of up to GRAPH_WIDTH tokens take the captured form
    (whole capacity, masked) also when run eagerly, which lets a CPU test run it."""

    skips = True  # hidden and logits take `skip` (self-speculative drafting)

    def __init__(self, model: PreTrainedModel, graphs: bool | None = None,
                 static: bool | None = None) -> None:
        body = model.base_model
        self.embed, self.layers = body.embed_tokens, body.layers
        self.norm, self.rotary = body.norm, body.rotary_emb
        self.head = model.get_output_embeddings()
        config = model.config
        self.head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads)
        self.kv_heads = config.num_key_value_heads
        self.groups = config.num_attention_heads // self.kv_heads
        self.projections = layer_projections(model)
        self.device = self.embed.weight.device
        self.dtype = self.embed.weight.dtype
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        if self.graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a model on a CUDA device")
        self.static = self.graphs if static is None else static
        self.graph_error: str | None = None  # why capture was given up, if it was
        self.length = 0
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)  # == length, on the device
        self.kv: Tensor | None = None
        self._offsets = torch.arange(GRAPH_WIDTH, device=self.device)
        self._ids = torch.zeros(GRAPH_WIDTH, dtype=torch.long, device=self.device)
        self._slots: Tensor | None = None  # arange(capacity)
        self._captured: dict[tuple, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self._pool = None
        # For a drafting head (decoding/capture.py). A capturing decoder runs every pass
        # eagerly: a graph's outputs are only the rows it was captured to return.
        self.capture_layers: tuple[int, ...] | None = None
        self.captured: list[Capture] = []

    @property
    def capacity(self) -> int:
        return 0 if self.kv is None else self.kv.shape[4]

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)
        self.pos.fill_(self.length)

    def reset(self) -> None:
        self.crop(0)

    def reserve(self, positions: int) -> None:
        """Room for `positions` cached positions. Growing moves the cache, so the graphs that
        read it are dropped (and captured again on use): a generation reserves its whole
        length before its first pass."""
        if positions <= self.capacity:
            return
        size = max(positions, 2 * self.capacity, FIRST_CAPACITY)
        size = -(-size // FIRST_CAPACITY) * FIRST_CAPACITY
        kv = torch.zeros(len(self.layers), 2, 1, self.kv_heads, size, self.head_dim,
                         dtype=self.dtype, device=self.device)
        if self.kv is not None:
            kv[..., : self.length, :] = self.kv[..., : self.length, :]
        self.kv = kv
        self._slots = torch.arange(size, device=self.device)
        self._captured.clear()

    @torch.inference_mode()
    def hidden(self, ids: Tensor, n: int = 1, skip: Skip = NO_SKIP) -> Tensor:
        return self._pass(ids, n, False, _frozen(skip))

    @torch.inference_mode()
    def logits(self, ids: Tensor, n: int = 1, skip: Skip = NO_SKIP) -> Tensor:
        return self._pass(ids, n, True, _frozen(skip))

    def _pass(self, ids: Tensor, n: int, head: bool, skip: Skip) -> Tensor:
        m = ids.shape[0]
        self.reserve(self.length + m)
        out = None
        if self.graphs and m <= GRAPH_WIDTH and self.capture_layers is None:
            out = self._replay(ids, n, head, skip)
        if out is None:
            static = self.static and m <= GRAPH_WIDTH
            out = self._forward(ids.to(self.device), n, head, skip, None if static else self.length)
        self.length += m
        self.pos.fill_(self.length)
        return out

    # --- one pass ------------------------------------------------------------------------

    def _forward(self, ids: Tensor, n: int, head: bool, skip: Skip,
                 start: int | None) -> Tensor:
        """The last n positions' hidden states (or logits) of a pass over `ids` [m] at
        positions pos..pos+m-1, writing their cache entries. `start` is the host's copy of pos
        for an eager pass (attention over exactly the cached positions); None for a captured
        pass (attention over the whole capacity, masked)."""
        m = ids.shape[0]
        positions = self.pos + self._offsets[:m] if m <= GRAPH_WIDTH else (
            self.pos + torch.arange(m, device=self.device))
        x = self.embed(ids)  # [m, hidden]
        cos, sin = self.rotary(x[None], positions[None])
        if start is None:  # whole capacity; row r of a stacked query is position r % m
            visible = self._slots[None, :] <= positions[:, None]  # [m, capacity]
            mask = visible.repeat(self.groups, 1) if self.groups > 1 else visible
        else:  # as transformers: no mask for one token, causal from an empty cache
            mask = None if m == 1 or start == 0 else torch.ones(
                m, start + m, dtype=torch.bool, device=self.device).tril(start)

        def attend(i: int, attn: torch.nn.Module, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            q, k, v = (t.view(1, m, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys, values = self.kv[i, 0], self.kv[i, 1]  # [1, kv_heads, capacity, head_dim]
            keys.index_copy_(2, positions, k)
            values.index_copy_(2, positions, v)
            if start is None:
                stacked = q.reshape(1, self.kv_heads, self.groups * m, self.head_dim)
                out = F.scaled_dot_product_attention(stacked, keys, values, attn_mask=mask,
                                                     scale=attn.scaling)
                return out.reshape(1, -1, m, self.head_dim).transpose(1, 2)[0]
            end = start + m
            return F.scaled_dot_product_attention(
                q, keys[:, :, :end], values[:, :, :end], attn_mask=mask, scale=attn.scaling,
                is_causal=start == 0 and m > 1, enable_gqa=self.groups > 1).transpose(1, 2)[0]

        inputs: list[Tensor] = []
        x = run_layers(x, self.layers, self.projections, attend, skip, self.capture_layers, inputs)
        if self.capture_layers is not None:  # normed apart: the returned rows keep their bits
            self.captured.append(Capture(self.length, self.norm(x), inputs))
        x = self.norm(x[-n:])
        return self.head(x) if head else x

    # --- CUDA graphs -------------------------------------------------------------------------

    def _replay(self, ids: Tensor, n: int, head: bool, skip: Skip) -> Tensor | None:
        """The pass replayed from its graph (captured now if new); None if capture failed,
        after which this decoder runs eagerly."""
        m = ids.shape[0]
        self._ids[:m].copy_(ids, non_blocking=True)
        key = (m, n, head, skip)
        if key not in self._captured and not self._capture(key):
            return None
        graph, out = self._captured[key]
        graph.replay()
        return out.clone()

    def _capture(self, key: tuple) -> bool:
        m, n, head, skip = key
        ids = self._ids[:m]
        try:
            # Warm-up passes on a side stream (lazy initialisation stays out of the graph).
            # A pass is idempotent: it rewrites the same cache entries from the same inputs.
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward(ids, n, head, skip, None)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self._forward(ids, n, head, skip, None)
        except Exception as e:  # a layer that syncs with the host (e.g. bitsandbytes int8)
            torch.cuda.synchronize(self.device)
            self.graphs = self.static = False
            self.graph_error = f"{type(e).__name__}: {e}".splitlines()[0]
            self._captured.clear()
            warnings.warn(f"CUDA graph capture failed ({self.graph_error}); decoding without "
                          "graphs, which is slower.", stacklevel=4)
            return False
        self._captured[key] = (graph, out)
        return True


def _frozen(skip: Skip) -> Skip:
    """The skip set with frozen members: it keys the graph cache."""
    return Skip(frozenset(skip.attention), frozenset(skip.mlp))
