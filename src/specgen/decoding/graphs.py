"""CUDA graph capture, in one place for whoever replays graphs: the decoders (cuda.py, fused.py:
a pass per width, a draft's chain of one-token passes) and the drafting heads
(core/head_drafters.py: a draft step, a catch-up per width, Medusa's heads).

`capture(body, inputs, device, pool)` runs `body(*inputs)` twice on a side stream (lazy
initialisation, autotuning and the allocator's first blocks stay out of the graph), then
captures it: the graph and its static outputs, which a replay rewrites in place. A body
reads only its static inputs and device state, never the host, so one graph serves every
replay.

A capture that fails is retried once, after its owner's reset (an empty pool, no graphs);
a second failure leaves the owner's passes eager, which `give_up_or_capture` says once in one
line (`graphs_off`, also a SpecgenWarning): a run without graphs is several times slower on a
GPU, and whoever reads its figures must know."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from specgen.errors import SpecgenWarning

CAPTURE_TRIES = 2  # a failed capture is retried once, from an empty pool


def capture(body: Callable[..., Any], inputs: Sequence[Tensor], device: torch.device,
            pool: Any = None) -> tuple[torch.cuda.CUDAGraph, Any]:
    """body(*inputs) as a CUDA graph on `device` (into `pool`, a graph_pool_handle, where
    given): (the graph, its static outputs)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            body(*inputs)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # thread_local: another thread's CUDA work (a server's) does not spoil the capture.
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        outputs = body(*inputs)
    return graph, outputs


def captured_or_reason(attempt: Callable[[], None], reset: Callable[[], None],
                       stacklevel: int = 2) -> str | None:
    """`attempt` (the captures), tried CAPTURE_TRIES times with `reset` after each failure:
    None once it succeeds, else why it was given up, said once as a SpecgenWarning (the
    caller then runs its passes eagerly)."""
    reason = retried(attempt, reset, CAPTURE_TRIES)
    if reason is not None:
        warnings.warn(graphs_off_line(reason), SpecgenWarning, stacklevel=stacklevel + 1)
    return reason


def retried(attempt: Callable[[], None], reset: Callable[[], None], tries: int) -> str | None:
    """Run `attempt` up to `tries` times, calling `reset` after each failure: None once it
    succeeds, else the last failure as one line (a failed reset ends the tries)."""
    reason = None
    for _ in range(tries):
        try:
            attempt()
            return None
        except Exception as e:  # a layer that syncs with the host; an allocator assert
            reason = one_line(e)
        try:
            reset()
        except Exception as e:
            return one_line(e)
    return reason


def one_line(e: BaseException) -> str:
    return (f"{type(e).__name__}: {e}".splitlines() or [type(e).__name__])[0]


def graphs_off_line(reason: str | None) -> str | None:
    """What a run says, once, when a decoder or head runs without graphs (None: it did not
    give up): how much slower is not measured here, only known to be several times on a GPU
    (the host's cost per pass)."""
    return None if reason is None else f"graphs off: {reason}; decoding several times slower"
