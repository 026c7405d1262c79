"""CUDA graph capture stood in for on a CPU: the CUDA decoder's own capture seams
(`_capture_graph` for a pass, `_capture` for a draft chain) replaced by ones that record each
capture, can fail the first ones, and return a "graph" whose replay runs the captured form
eagerly into the static output."""

from __future__ import annotations


class EagerGraph:
    """What a captured graph does on replay, done eagerly: the pass over the static inputs,
    written into the static output."""

    def __init__(self, decoder, key: tuple, out, states) -> None:
        self.decoder, self.key, self.out, self.states = decoder, key, out, states

    def replay(self) -> None:
        m, n, head, skip, tree = self.key
        self.out.copy_(self.decoder._forward(self.decoder._ids[:m], n, head, skip, None, tree))
        if self.states is not None:  # a drafting head's states, into the static buffers
            (normed, inputs), (new_normed, new_inputs) = self.states, self.decoder._states
            normed.copy_(new_normed)
            for static, new in zip(inputs, new_inputs):
                static.copy_(new)
            self.decoder._states = self.states  # what a replay leaves: the graph's buffers


def fake_graphs(decoder, failures: int = 0, error: Exception | None = None) -> list[tuple]:
    """Turn `decoder`'s graphs on with a stand-in capture whose first `failures` calls raise
    `error` (default: the allocator's assert as a RuntimeError); returns the list of the keys
    it was asked to capture, in order, failed ones included."""
    error = error or RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED at "
                                  "\"CUDACachingAllocator.cpp\":2799\nmore lines")
    keys: list[tuple] = []

    def capture(key: tuple):
        keys.append(key)
        if len(keys) <= failures:
            raise error
        m, n, head, skip, tree = key
        out = decoder._forward(decoder._ids[:m], n, head, skip, None, tree)
        states = decoder._states if decoder.capture_layers is not None else None
        return EagerGraph(decoder, key, out, states), out, states

    def capture_body(body, inputs):
        """A draft chain's graph (the decoder's `_capture`): its key is ("chain", steps)."""
        keys.append(("chain", len(body(*inputs)[0])))
        if len(keys) <= failures:
            raise error
        outputs = tuple(t.clone() for t in body(*inputs))
        return BodyGraph(body, inputs, outputs), outputs

    decoder.graphs = decoder.static = True
    decoder._capture_graph = capture
    decoder._capture = capture_body
    return keys


class BodyGraph:
    """A graph of `body(*inputs)` replayed eagerly into its static outputs; `replays` counts."""

    def __init__(self, body, inputs, outputs) -> None:
        self.body, self.inputs, self.outputs, self.replays = body, inputs, outputs, 0

    def replay(self) -> None:
        self.replays += 1
        for static, new in zip(self.outputs, self.body(*self.inputs)):
            static.copy_(new)


def fake_head_graphs(drafter) -> list[str]:
    """Stand in for an EAGLE drafter's graph capture (`_capture_graph`): the pass run once as
    a capture would, into static outputs, and a "graph" whose replay runs it eagerly over the
    same static inputs into them. Returns a list that gets the pass's name on each replay."""
    replays: list[str] = []

    def capture(body, inputs):
        outputs = tuple(t.clone() for t in body(*inputs))

        class Graph:
            def replay(self) -> None:
                replays.append(body.__name__)
                for static, new in zip(outputs, body(*inputs)):
                    static.copy_(new)

        return Graph(), outputs

    drafter._capture_graph = capture
    return replays
