"""Drafters that are heads on the target itself (heads/): EAGLE-1/2, EAGLE-3 and Medusa-1.
They read the hidden states the target's own passes computed anyway (decoding/capture.py),
so drafting costs the head's small forward and no target work.

The engine hands the target's decoder over once (`bind_target`); the drafter then asks it to
keep each pass's hidden states and takes them after every pass (`rollback`, which the engine
calls after each verification, and `propose`, which follows the prompt's pass). Only the rows
of kept tokens are true features: a position p's feature is true once the target's cache
holds p (it depends on tokens 0..p only).

An EAGLE head reads pairs (f_j, token_{j+1}) at position j and predicts f_{j+1}. Its cache
holds pairs made from true features only: the catch-up pairs of a `propose` (every kept
position since the last one, in one forward), never its own guesses, which are cropped away
after each draft. So rollback stays a length. A Medusa head reads only the newest true
feature: head i guesses the token i + 2 places after it.

Exactness is the engine's, as for every drafter: greedy drafts are verified against the
target's argmax, and sampled drafts come with the distribution q they were drawn from, on the
target's vocabulary (EAGLE-3's reduced vocabulary scattered through d2t).

On a GPU an EAGLE head's passes replay CUDA graphs over a static head cache (heads/modules.py:
HeadCache) whose length is also on the device: one graph for a draft step (one token: its
embedding, the head's layer, the output layer) and one per width of a catch-up up to the
generation's K + 1, all captured when the engine reserves room before the prompt's pass; a
wider catch-up (the prompt's) runs eagerly over the same cache. A Medusa head's logits, every
head from one feature, are one graph. A capture that fails twice leaves the passes eager, and
says so once (as the CUDA decoder does)."""

from __future__ import annotations

import torch
from torch import Tensor

from specgen.core.base import Drafter
from specgen.core.draws import pick, read_once
from specgen.core.sampling import SamplingParams
from specgen.decoding import graphs
from specgen.decoding.graphs import graphs_off_line
from specgen.heads.modules import Eagle3Head, EagleHead, Head, HeadCache, MedusaHeads


def output_rows(layer: torch.nn.Module, rows: int | None, dtype: torch.dtype,
                device: torch.device) -> Tensor | None:
    """The first `rows` rows of an output layer's weight as a float [rows, H] tensor: a view of
    a float Linear's, or read back from a quantized one by applying it to the identity (in
    chunks). None: use the layer as it is (all its rows)."""
    if rows is None or rows >= layer.out_features:
        return None
    if isinstance(layer, torch.nn.Linear) and layer.bias is None:
        return layer.weight[:rows].to(dtype)
    with torch.no_grad():
        eye = torch.eye(layer.in_features, dtype=torch.float32, device=device)
        parts = [layer(eye[i : i + 256])[:, :rows].float() for i in range(0, eye.shape[0], 256)]
        return torch.cat(parts).t().contiguous().to(dtype)


def as_linear(weight: Tensor) -> torch.nn.Linear:
    """A bias-free Linear over `weight` [out, in] (no copy), made fast for one-row products on
    a CPU as a draft's layers are (kernels.prepare)."""
    from specgen.kernels import prepare

    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    return prepare(layer, "draft")


class Drafted:
    """The tokens one `propose` has drafted, and the q each was drawn from (with greedy
    drafts, the softmax of the logits). `keep` adds one and says whether to draft on: not
    past a token whose probability is below the drafter's confidence, nor once the chance
    that every draft so far is right falls below `stop_below`."""

    def __init__(self, greedy: bool, confidence: float, stop_below: float) -> None:
        self.greedy, self.confidence, self.stop_below = greedy, confidence, stop_below
        self.ids: list[Tensor] = []
        self.qs: list[Tensor] = []
        self.sure = 1.0

    def keep(self, token: Tensor, q: Tensor | None, p: float | None) -> bool:
        self.ids.append(token)
        if q is not None:
            self.qs.append(q)
        if p is not None:
            self.sure *= p
            if p < self.confidence or self.sure < self.stop_below:
                return False
        return True

    def result(self) -> tuple[Tensor, Tensor]:
        return torch.stack(self.ids), torch.stack(self.qs)


class HeadDrafter(Drafter):
    """What the three kinds share: binding to the target, taking its hidden states, the
    feature store of true features not yet read, rollback and reset."""

    ends_own_drafts = True
    # Its q (returned with greedy drafts too) ranks the next-likeliest tokens a token tree may
    # branch to (core/tree.py). Its state is true features only, never its own drafts: after a
    # tree it keeps every kept position, the branch's too (the target's capture keeps the
    # branch's rows: decoding/capture.py).
    branches = True
    holds_drafts = False

    def __init__(self, head: Head, target_vocab: int, head_rows: int | None = None,
                 confidence: float = 0.0) -> None:
        self.head = head
        self.kind = head.kind
        self.vocab_size = target_vocab
        self.head_rows = head_rows
        self.confidence = confidence
        # The GPU's way (core/draws.py): the stop rule on the device, the drafts read once,
        # with their branch scores where the target verifies trees. None: on a CUDA device,
        # decided when bound.
        self.stop_on_device: bool | None = None
        self.scores_branches = False
        self.decoder = None
        self.device = torch.device("cpu")
        self.graph_error: str | None = None
        self._passes = 0
        self._feats: Tensor | None = None  # true features of positions [_start, _start + len)
        self._start = 0

    # --- the engine's hook ------------------------------------------------------------------

    def bind_target(self, decoder, model) -> None:
        """Take the target's decoder (its passes' hidden states) and model (embedding, output
        layer, device, dtype); called once, when the generator is built."""
        self.decoder = decoder
        decoder.capture_layers = self.capture_layers()
        decoder.captured.clear()
        embed = model.get_input_embeddings()
        self.device, self.dtype = embed.weight.device, embed.weight.dtype
        if self.stop_on_device is None:
            self.stop_on_device = self.device.type == "cuda"
        self.scores_branches = decoder.verifies_trees
        self.head.to(device=self.device, dtype=self.dtype)
        from specgen.kernels import prepare

        prepare(self.head, "draft")  # one-row products by the CPU kernel where it serves
        # An EAGLE-3 head of another width than the target's has an embedding of its own.
        own = isinstance(self.head, Eagle3Head) and self.head.config.own_embedding
        self.embed = self.head.embed_tokens if own else embed
        self.reset()

    def capture_layers(self) -> tuple[int, ...]:
        return ()

    # --- CUDA graphs of the head's passes (on a GPU) ----------------------------------------

    @property
    def graphs_off(self) -> str | None:
        """The one line that says this head gave up on graphs, and why (None: it did not)."""
        return graphs_off_line(self.graph_error)

    def _captured_or_off(self, capture, drop) -> None:
        """capture(), tried twice with drop() between; a second failure leaves the head's
        passes eager and says so once (decoding/graphs.py)."""
        reason = graphs.captured_or_reason(capture, drop, stacklevel=3)
        if reason is not None:
            self.graphs, self.graph_error = False, reason

    def _capture_graph(self, body, inputs: tuple[Tensor, ...]) -> tuple:
        """body(*inputs) as a CUDA graph: (the graph, its static outputs)."""
        return graphs.capture(body, inputs, self.device)

    # --- the feature store -------------------------------------------------------------------

    def _take(self) -> None:
        """Move the decoder's captured passes into the feature store: a pass starting at p
        replaces whatever the store held from p on (the target's cache was cut back there)."""
        if self.decoder is None:
            raise RuntimeError("a head drafter drafts only once bound to its target "
                               "(SpeculativeGenerator calls bind_target)")
        for capture in self.decoder.captured:
            feats = self._features(capture)
            end = self._start + (0 if self._feats is None else self._feats.shape[0])
            if self._feats is None or not self._start <= capture.start <= end:
                self._feats, self._start = feats, capture.start  # a gap: start afresh there
                self._restart(capture.start)
            else:
                self._feats = torch.cat([self._feats[: capture.start - self._start], feats])
        self.decoder.captured.clear()

    def _features(self, capture) -> Tensor:
        return capture.final

    def _restart(self, position: int) -> None:
        """The store no longer reaches back to what the head has read: start the head anew."""

    def _feature(self, position: int) -> Tensor | None:
        i = position - self._start
        if self._feats is None or not 0 <= i < self._feats.shape[0]:
            return None
        return self._feats[i]

    # --- the Drafter protocol ----------------------------------------------------------------

    @property
    def forward_passes(self) -> int:
        return self._passes

    def guessers(self, tokens: Tensor) -> dict:
        return {self.kind: self}

    def reset(self) -> None:
        self._feats, self._start, self._passes = None, 0, 0
        if self.decoder is not None:
            self.decoder.captured.clear()

    def rollback(self, n_valid: int) -> None:
        if self.decoder is not None:
            self._take()
        if self._feats is not None:
            self._feats = self._feats[: max(0, n_valid - self._start)]

    def _pick(self, logits: Tensor, params: SamplingParams, generator: torch.Generator | None,
              stop_below: float) -> tuple[Tensor, Tensor, float | None]:
        """A draft token from `logits`, the q it was drawn from (with greedy drafts, the
        softmax of the logits: a tree's branches are ranked by it) and the draft's probability
        of it, read on the host (None where no stop needs it, or the stop rule runs on the
        device: reading it waits for the device)."""
        token, q = pick(logits, params, generator)
        if self.stop_on_device or not (self.confidence or stop_below):
            return token, q, None
        return token, q, float(q[token])

    def _drafts(self, drafted: Drafted, stop_below: float) -> tuple[Tensor, Tensor]:
        """What a propose returns: its drafts and their q, cut by the stop rule on the device
        where it runs there (read once, with the branch scores)."""
        drafts, qs = drafted.result()
        self.read_branches = None
        if not self.stop_on_device:
            return drafts, qs
        n, self.read_branches = read_once(drafts, qs, self.confidence, stop_below,
                                          self.scores_branches)
        return drafts[:n], qs[:n]


class EagleDrafter(HeadDrafter):
    """EAGLE-1/2 and EAGLE-3: one decoder layer run autoregressively on its own features."""

    def __init__(self, head: EagleHead | Eagle3Head, target_vocab: int,
                 head_rows: int | None = None, confidence: float = 0.0,
                 graphs: bool | None = None) -> None:
        super().__init__(head, target_vocab, head_rows, confidence)
        self.cache = HeadCache()
        self._base = 0  # the position of the head cache's first pair
        # CUDA graphs of its passes (None: default, on a CUDA device, decided when bound);
        # `static` (default: graphs) runs the graphs' form (a static cache) eagerly too.
        self.graphs, self.static = graphs, graphs
        self.widest = 1  # catch-ups of up to this many pairs replay graphs
        self._graph = None  # the draft step's: (graph, static outputs, static inputs)
        self._catch_ups: dict[int, tuple] = {}  # width -> (graph, static outputs)
        self._catch_up_inputs: tuple[Tensor, Tensor, Tensor] | None = None

    def capture_layers(self) -> tuple[int, ...]:
        return tuple(self.head.config.aux_layers) if self.kind == "eagle3" else ()

    def bind_target(self, decoder, model) -> None:
        super().bind_target(decoder, model)
        # EAGLE-1/2 scores its features with the target's output layer (maybe cut to its
        # first rows, as a draft model's may be: ModelDrafter).
        self.lm_head = model.get_output_embeddings()
        rows = output_rows(self.lm_head, self.head_rows, self.dtype, self.device)
        self.rows = None if rows is None else as_linear(rows)
        if self.kind == "eagle3":  # where each draft id's probability goes in the target's vocabulary
            self.d2t_index = self.head.target_ids(
                torch.arange(self.head.config.draft_vocab, device=self.device))
        if self.graphs is None:
            self.graphs = self.device.type == "cuda"
        self.static = self.graphs if self.static is None else self.static
        self.cache = HeadCache(static=self.static or self.graphs)
        self._drop_graphs()

    def _drop_graphs(self) -> None:
        self._graph, self._catch_ups, self._catch_up_inputs = None, {}, None

    def reserve(self, positions: int, widest: int = 1) -> None:
        """Room in a static head cache for `positions` pairs, and (on a GPU) the graphs of a
        draft step and of catch-ups of up to `widest` pairs captured, before a generation's
        first timed pass; growth moves the cache, so the graphs that read it are captured
        again."""
        if not self.cache.static:
            return
        self.widest = max(self.widest, widest)
        c = self.head.config
        like = torch.zeros(1, c.kv_heads, 1, c.head_dim, dtype=self.dtype, device=self.device)
        # a capture's warm-ups write as many pairs past the length as its width
        if self.cache.reserve(max(positions, self.cache.length + self.widest), like):
            self._drop_graphs()
        if self.graphs and (self._graph is None or len(self._catch_ups) < self.widest):
            self._captured_or_off(self._capture, self._drop_graphs)

    def _capture(self) -> None:
        """The graphs not captured yet, over static inputs and outputs: the draft step's and
        each catch-up width's. Their warm-ups write the cache past its length, which the next
        pass rewrites."""
        c, like = self.head.config, dict(device=self.device)
        if self._graph is None:
            inputs = (torch.zeros(c.hidden, dtype=self.dtype, **like),
                      torch.zeros(1, dtype=torch.long, **like), torch.zeros(1, dtype=torch.long, **like))
            self._graph = (*self._capture_graph(self._draft_body, inputs), inputs)
        if self._catch_up_inputs is None or self._catch_up_inputs[1].shape[0] < self.widest:
            features = 3 * (c.target_hidden or c.hidden) if self.kind == "eagle3" else c.hidden
            self._catch_up_inputs = (torch.zeros(self.widest, features, dtype=self.dtype, **like),
                                     torch.zeros(self.widest, dtype=torch.long, **like),
                                     torch.zeros(1, dtype=torch.long, **like))
            self._catch_ups = {}
        hidden, tokens, start = self._catch_up_inputs
        for width in range(1, self.widest + 1):
            if width not in self._catch_ups:
                self._catch_ups[width] = self._capture_graph(
                    self._catch_up_body, (hidden[:width], tokens[:width], start))


    def _features(self, capture) -> Tensor:
        if self.kind == "eagle3":
            return torch.cat(capture.layer_inputs, dim=-1)
        return capture.final

    def _restart(self, position: int) -> None:
        self.cache.crop(0)
        self._base = position

    def reset(self) -> None:
        super().reset()
        self.cache.crop(0)
        self._base = 0

    def rollback(self, n_valid: int) -> None:
        super().rollback(n_valid)
        # Pair j reads token j + 1: it stays while tokens 0..j+1 do.
        self.cache.crop(max(0, n_valid - 1 - self._base))

    def _forward(self, hidden: Tensor, tokens: Tensor, positions: Tensor, fused: bool
                 ) -> tuple[Tensor, Tensor]:
        """The head over pairs (hidden[i], tokens[i]) at `positions`, written to its cache
        (all on the device; a graph replays this): (its last output [H], the logits read
        from it: over target ids 0..V'-1 for EAGLE-1/2, through the target's output layer;
        over its draft vocabulary for EAGLE-3, mapped to target ids by `target_ids`)."""
        embeds = self.embed(tokens)[None].to(self.dtype)
        if isinstance(self.head, Eagle3Head):
            out, logits = self.head(hidden[None], embeds, positions, self.cache, fused=fused)
            return out[0, -1], logits[0, -1]
        out = self.head(hidden[None], embeds, positions, self.cache)[0, -1]
        if self.rows is not None:
            return out, self.rows(out)
        return out, self.lm_head(out)[..., : self.vocab_size]

    def _step(self, hidden: Tensor, tokens: Tensor, start: int, fused: bool
              ) -> tuple[Tensor, Tensor]:
        """`_forward` run eagerly at positions start..: (its last output [H], its logits)."""
        t = tokens.shape[0]
        self._passes += 1
        if self.cache.static and self.cache.length + t > self.cache.capacity:
            self.reserve(self.cache.length + t)
        positions = torch.arange(start, start + t, device=self.device)
        tokens = tokens.to(self.device, non_blocking=True)  # the host's context: no wait
        result = self._forward(hidden.to(self.dtype), tokens, positions, fused)
        if self.cache.static:
            self.cache.advance(t)
        return result

    def _catch_up_body(self, hidden: Tensor, tokens: Tensor, start: Tensor
                       ) -> tuple[Tensor, Tensor]:
        """A catch-up as its graph replays it: pairs at positions start.. (a device tensor)."""
        return self._forward(hidden, tokens, start + torch.arange(tokens.shape[0],
                                                                  device=self.device), True)

    def _draft_body(self, out: Tensor, token: Tensor, position: Tensor) -> tuple[Tensor, Tensor]:
        """A draft step as its graph replays it: the pair (out, token) at `position`."""
        return self._forward(out[None], token, position, False)

    def _replay(self, graph, outputs: tuple[Tensor, Tensor], t: int) -> tuple[Tensor, Tensor]:
        """A captured pass of t pairs replayed (its inputs copied in): its outputs, kept."""
        graph.replay()
        self._passes += 1
        self.cache.advance(t)
        return outputs[0].clone(), outputs[1].clone()

    def _catch_up(self, hidden: Tensor, tokens: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """The catch-up's pairs read into the cache, replayed from its width's graph where
        there is one and room for it: (the head's last output, its logits)."""
        t = tokens.shape[0]
        if t not in self._catch_ups or self.cache.length + t > self.cache.capacity:
            return self._step(hidden, tokens, start, fused=True)
        s_hidden, s_tokens, s_start = self._catch_up_inputs
        s_hidden[:t].copy_(hidden)
        s_tokens[:t].copy_(tokens, non_blocking=True)  # from the host's context: no wait
        s_start.fill_(start)
        return self._replay(*self._catch_ups[t], t)

    def _draft_step(self, out: Tensor, token: Tensor, position: int) -> tuple[Tensor, Tensor]:
        """The pair (out, token) at `position` read into the cache: (the head's next output,
        its logits), replayed from the step's graph where there is one and room for it."""
        if self._graph is None or self.cache.length + 1 > self.cache.capacity:
            return self._step(out[None], token[None], position, fused=False)
        graph, outputs, (s_out, s_token, s_position) = self._graph
        s_out.copy_(out)
        s_token.copy_(token.view(1))
        s_position.fill_(position)
        return self._replay(graph, outputs, 1)

    @torch.no_grad()  # when called outside the engine's inference mode, as tests do
    def propose(self, tokens: Tensor, k: int, params: SamplingParams,
                generator: torch.Generator | None, stop_below: float = 0.0
                ) -> tuple[Tensor, Tensor | None]:
        self._take()
        last = tokens.shape[0] - 1  # the pending token's position: its feature is not known yet
        if k < 1 or self._feature(last - 1) is None:
            return tokens.new_empty(0), None
        first = self._base + self.cache.length  # the first pair the head has not read
        if first >= last:  # asked again with nothing new: read the newest pair once more
            self.cache.crop(last - 1 - self._base)
            first = last - 1
        if first < self._start:  # its features are gone (bound late): read from what is kept
            self._restart(self._start)
            first = self._start
        feats = self._feats[first - self._start : last - self._start]
        true_length = self.cache.length + feats.shape[0]
        # 1. Catch up: every kept pair since the last draft, in one forward; its last output
        #    predicts the pending token's feature, whose logits give the first draft.
        out, logits = self._catch_up(feats, tokens[first + 1 : last + 1], first)
        drafted = Drafted(params.greedy, self.confidence, stop_below)
        for i in range(k):
            token, q, p = self._pick(logits, params, generator, stop_below)
            if self.kind == "eagle3":
                token = self.head.target_ids(token)
                if q is not None:
                    q = q.new_zeros(self.vocab_size).index_copy_(0, self.d2t_index, q)
            if not drafted.keep(token, q, p):
                break
            if i + 1 < k:  # 2. Draft on: the head's own output as the next feature.
                out, logits = self._draft_step(out, token, last + i)
        self.cache.crop(true_length)  # its guesses never stay in the cache
        return self._drafts(drafted, stop_below)


class MedusaDrafter(HeadDrafter):
    """Medusa-1: every head reads the newest true feature; head i guesses token i + 2 after
    it, independently of the guesses before it (each q is still what its token was drawn
    from, so rejection sampling stays exact)."""

    def __init__(self, head: MedusaHeads, target_vocab: int, head_rows: int | None = None,
                 confidence: float = 0.0, graphs: bool | None = None) -> None:
        super().__init__(head, target_vocab, head_rows, confidence)
        rows = head.config.draft_vocab or target_vocab
        self.rows = min(rows, target_vocab, head_rows or rows)
        # Every head's logits from one feature as one CUDA graph (None: default, on a CUDA
        # device, decided when bound): (graph, static outputs, static inputs).
        self.graphs = graphs
        self._graph = None

    def bind_target(self, decoder, model) -> None:
        super().bind_target(decoder, model)
        self.outputs = [as_linear(head[-1].weight[: self.rows]) for head in self.head]
        if self.graphs is None:
            self.graphs = self.device.type == "cuda"
        self._graph = None

    def reserve(self, positions: int, widest: int = 1) -> None:
        """Every head's graph captured (on a GPU) before a generation's first timed pass."""
        if self.graphs and self._graph is None:
            self._captured_or_off(self._capture, lambda: setattr(self, "_graph", None))

    def _capture(self) -> None:
        inputs = (torch.zeros(self.head.config.hidden, dtype=self.dtype, device=self.device),)
        self._graph = (*self._capture_graph(self._heads_body, inputs), inputs)

    def _head_logits(self, i: int, feature: Tensor) -> Tensor:
        x = feature
        for block in self.head[i][:-1]:
            x = block(x)
        return self.outputs[i](x)

    def _heads_body(self, feature: Tensor) -> tuple[Tensor]:
        """Every head's logits from `feature` [H], as the graph replays it: ([heads, rows],)."""
        return (torch.stack([self._head_logits(i, feature) for i in range(len(self.head))]),)

    def _replayed(self, feature: Tensor) -> Tensor | None:
        """Every head's logits [heads, rows] from the graph; None where there is none (the
        heads then run eagerly, each only if its token is asked for)."""
        if self._graph is None:
            return None
        graph, (logits,), (s_feature,) = self._graph
        s_feature.copy_(feature)
        graph.replay()
        return logits.clone()

    @torch.no_grad()
    def propose(self, tokens: Tensor, k: int, params: SamplingParams,
                generator: torch.Generator | None, stop_below: float = 0.0
                ) -> tuple[Tensor, Tensor | None]:
        self._take()
        feature = self._feature(tokens.shape[0] - 2)  # the last position the target has read
        k = min(k, len(self.head))
        if k < 1 or feature is None:
            return tokens.new_empty(0), None
        self._passes += 1
        drafted = Drafted(params.greedy, self.confidence, stop_below)
        feature = feature.to(self.dtype)
        replayed = self._replayed(feature)
        for i in range(k):
            logits = replayed[i] if replayed is not None else self._head_logits(i, feature)
            token, q, p = self._pick(logits, params, generator, stop_below)
            if not drafted.keep(token, q, p):
                break
        return self._drafts(drafted, stop_below)


def make_head_drafter(head: Head, target_vocab: int, head_rows: int | None = None,
                      confidence: float = 0.0) -> HeadDrafter:
    if isinstance(head, MedusaHeads):
        return MedusaDrafter(head, target_vocab, head_rows, confidence)
    return EagleDrafter(head, target_vocab, head_rows, confidence)
