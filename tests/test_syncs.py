"""Host syncs per speculative step, counted on a CPU (support.syncs: every read of a tensor's
value by the host, which on a GPU waits for the device): at most 2 a step for every drafter
kind, greedy and sampled, with adaptive K's stop rule and token trees on. The drafters run
the GPU's way (`stop_on_device`: the stop rule on the device, the drafts read once); the CPU's
own way stops a draft at once, reading each token's probability, since a read costs nothing
there."""

import warnings
from copy import deepcopy

import pytest
import torch

from specgen.choices import HEAD_KINDS, MAX_TREE_ROWS
from specgen.core.adaptive import Planner
from specgen.core import drafters, engine
from specgen.core.drafters import HybridDrafter, ModelDrafter, make_drafter
from specgen.core.engine import SpeculativeGenerator
from specgen.core.head_drafters import EagleDrafter, HeadDrafter, MedusaDrafter
from specgen.core.sampling import SamplingParams
from specgen.core.tree import choose_branches
from specgen.decoding import graphs
from specgen.decoding.cuda import CudaDecoder

KINDS = ("draft-model", "prompt-lookup", "hybrid", "self", "eagle", "eagle3", "medusa")
MAX_SYNCS = 2


def make(kind, tiny_pair, fitted_head, confidence, fake_head_graphs):
    """A target and the kind's drafter, their passes the GPU's: the CUDA decoder's and the
    head's graphs, their capture stood in for (each replay runs the captured form)."""
    if kind in HEAD_KINDS:
        target, head = fitted_head(kind, draft_vocab=48 if kind == "eagle3" else None)
        make_head = MedusaDrafter if kind == "medusa" else EagleDrafter
        drafter = make_head(head, target.config.vocab_size, confidence=confidence, graphs=True)
        fake_head_graphs(drafter)
        return target, drafter
    target, draft = tiny_pair()
    model = draft if kind in ("draft-model", "hybrid") else None
    return target, make_drafter(kind, model, target.config.vocab_size, confidence=confidence)


def gpu_decoders(monkeypatch, fake_graphs) -> None:
    """Every decoder made from now on the CUDA decoder, its graphs stood in for."""
    def make(model, exact=False):
        decoder = CudaDecoder(model)
        fake_graphs(decoder)
        return decoder

    monkeypatch.setattr(engine, "make_decoder", make)
    monkeypatch.setattr(drafters, "make_decoder", make)


def the_gpus_way(drafter) -> None:
    """The drafter's stop rule on the device, its drafts read once (as on a GPU)."""
    if isinstance(drafter, HybridDrafter):
        drafter = drafter.model_drafter
    if isinstance(drafter, (ModelDrafter, HeadDrafter)):
        drafter.stop_on_device = True


def every_branch(self, scores, tokens, k):
    """Planner.branches with every candidate worth its row: each drafted chain is a tree."""
    chosen = choose_branches(scores, tokens, 0.0, MAX_TREE_ROWS - 1 - k)
    self.branch_offer = sum(score for _, _, score in chosen)
    return [(index, token) for index, token, _ in chosen]


def prompt(vocab=64):
    """A context that repeats itself, so prompt lookup finds matches."""
    part = torch.randint(0, vocab, (10,), generator=torch.Generator().manual_seed(5))
    return torch.cat([part, part, part[:4]])


def reads_per_step(kind, mode, temperature, tiny_pair, fitted_head, host_reads, monkeypatch,
                   fake_graphs, fake_head_graphs):
    """(reads of each speculative step, the run's stats): `mode` "chains", a fixed K = 4
    with a draft stopped below a confidence of 0.3; "trees", adaptive K with every chain
    verified as a token tree with every branch it offers."""
    gpu_decoders(monkeypatch, fake_graphs)
    target, drafter = make(kind, tiny_pair, fitted_head, 0.3 if mode == "chains" else 0.0,
                           fake_head_graphs)
    the_gpus_way(drafter)
    if mode == "trees":
        monkeypatch.setattr(Planner, "branches", every_branch)
    gen = SpeculativeGenerator(target, drafter, 4, adaptive=mode == "trees",
                               prepare=False)
    host_reads.before.clear()
    host_reads.now = 0
    result = gen.generate(prompt(target.config.vocab_size), max_new_tokens=40,
                          temperature=temperature, seed=1)
    return host_reads.per_step(), result.stats


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("mode", ["chains", "trees"])
@pytest.mark.parametrize("kind", KINDS)
def test_at_most_two_host_syncs_a_step(kind, mode, temperature, tiny_pair, fitted_head,
                                       host_reads, monkeypatch, fake_graphs, fake_head_graphs):
    steps, stats = reads_per_step(kind, mode, temperature, tiny_pair, fitted_head, host_reads,
                                  monkeypatch, fake_graphs, fake_head_graphs)
    print(f"{kind:14} {mode:6} t={temperature} max {max(steps)} mean {sum(steps) / len(steps):.2f}"
          f" over {len(steps)} steps, {stats.tree_steps} trees:", steps)
    assert steps and max(steps) <= MAX_SYNCS, steps


STOPS = [(0.0, 0.0), (0.0, 0.3), (0.0, 0.7), (0.5, 0.0), (0.4, 0.2)]  # (confidence, stop_below)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(1.0), SamplingParams(0.7, top_k=8)],
                         ids=["greedy", "sampled", "top-k"])
@pytest.mark.parametrize("kind", ["draft-model", "self", "eagle", "eagle3", "medusa"])
def test_the_stop_rule_on_the_device_keeps_the_hosts_drafts(kind, params, tiny_pair,
                                                            fitted_head, fake_graphs,
                                                            fake_head_graphs, monkeypatch):
    """The same context and seed, every stop rule: drafting the GPU's way (every draft
    drawn, the rule applied on the device, one read) proposes what the host's rule does,
    token for token and q to the bit, and leaves the draft's cache where the host's does."""
    gpu_decoders(monkeypatch, fake_graphs)
    target, drafter = make(kind, tiny_pair, fitted_head, 0.0, fake_head_graphs)
    gen = SpeculativeGenerator(target, drafter, 5, adaptive=False, prepare=False)
    context = torch.tensor(gen.generate(prompt(target.config.vocab_size), max_new_tokens=12
                                        ).token_ids)
    context = torch.cat([prompt(target.config.vocab_size), context])
    found = set()
    with torch.inference_mode():  # as the engine drafts: the caches are inference tensors
        drafter.rollback(len(context) - 1)
        drafter.propose(context, 1, params, None)  # read up to the pending token: each
        check_proposals(drafter, context, params, found)  # propose below reads it alone
    assert len(found) >= 3  # drafts stopped at several lengths
    if isinstance(drafter, ModelDrafter):  # the GPU's way drew its passes as one graph
        assert drafter.lm.decoder._chains


def check_proposals(drafter, context, params, found):
    for k in (1, 3, 5):
        for confidence, stop_below in STOPS:
            drafter.confidence = confidence
            proposals = []
            for on_device in (False, True):
                drafter.stop_on_device = on_device
                drafter.rollback(len(context) - 1)
                drafts, q = drafter.propose(context, k, params,
                                            torch.Generator().manual_seed(k), stop_below)
                held = drafter.lm.length if isinstance(drafter, ModelDrafter) else None
                proposals.append((drafts.tolist(), q.flatten().tolist(), held))
            assert proposals[0] == proposals[1], (k, confidence, stop_below)
            found.add(len(proposals[0][0]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["chains", "trees"])
@pytest.mark.parametrize("kind", ["draft-model", "prompt-lookup", "hybrid", "self", "eagle",
                                  "medusa"])
def test_on_a_gpu_a_step_syncs_at_most_twice(kind, mode, tiny_pair, fitted_head, monkeypatch):
    """The real count: CUDA's sync debug mode warns at every wait for the device (reads and
    blocking copies alike), on the decoders and graphs a GPU run gets; a second generation,
    its steps that captured a graph (a draft chain of a length not met before) left out."""
    if kind in HEAD_KINDS:
        target, head = fitted_head(kind)
        target, head = deepcopy(target).cuda(), deepcopy(head).cuda()
        drafter = make_drafter(kind, None, target.config.vocab_size, head=head,
                               confidence=0.3 if mode == "chains" else 0.0)
    else:
        target, draft = (deepcopy(m).cuda() for m in tiny_pair())
        drafter = make_drafter(kind, draft if kind in ("draft-model", "hybrid") else None,
                               target.config.vocab_size,
                               confidence=0.3 if mode == "chains" else 0.0)
    if mode == "trees":
        monkeypatch.setattr(Planner, "branches", every_branch)
    gen = SpeculativeGenerator(target, drafter, 4, adaptive=mode == "trees", prepare=False)
    ids = prompt(target.config.vocab_size).cuda()
    gen.generate(ids, max_new_tokens=40)  # every graph captured
    marks, captures = [], []
    plan, capture = Planner.plan, graphs.capture

    def capturing(*args, **kwargs):
        captures.append(len(caught))
        return capture(*args, **kwargs)

    monkeypatch.setattr(graphs, "capture", capturing)

    def planned(self, *args, **kwargs):
        marks.append(len(caught))
        return plan(self, *args, **kwargs)

    monkeypatch.setattr(Planner, "plan", planned)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            gen.generate(ids, max_new_tokens=40)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    ends = marks[1:] + [len(caught)]
    syncs = [b - a for a, b in zip(marks, ends) if not any(a <= c <= b for c in captures)]
    assert syncs and max(syncs) <= MAX_SYNCS, (syncs, [str(w.message)[:80] for w in caught[:3]])
