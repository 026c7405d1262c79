"""Token trees on the GPU decoders (decoding/cuda.py, decoding/fused.py). Without a GPU, on
the CPU: the CUDA decoder eagerly and in its captured form, the fused decoder's kernels in
Triton's interpreter (conftest.py); on a GPU the same tests replay CUDA graphs, in bf16 too.
Every node's logits are a one-token pass's after its branch (bit for bit through the fused
kernels, to rounding through PyTorch's attention); after `keep_branch` the cache continues as
plain decoding; one graph per width serves every tree of that width; greedy speculation with
a tree on every step gives the decoder's own greedy output."""

from __future__ import annotations

import copy

import pytest
import torch

from specgen.choices import MAX_TREE_ROWS
from specgen.core.adaptive import Planner
from specgen.core.drafters import ModelDrafter
from specgen.core.engine import SpeculativeGenerator
from specgen.core.tree import Tree, choose_branches
from specgen.decoding.cuda import DEFAULT_VARIANTS, TREE_VARIANT, CudaDecoder, graph_keys
from specgen.kernels import gpu

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# the interpreter's bf16 is unreliable; on a GPU the fused kernels' rows are bf16's too
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])

# root, chain d1..d4, a branch at depth 4, a branch with a child at depth 2, one at depth 1
PARENTS = (-1, 0, 1, 2, 3, 3, 1, 6, 0)
KEPT = [1, 6, 7]  # a branch that leaves the chain after its first draft


def fused(model, **kwargs):
    pytest.importorskip("triton")
    if not gpu.available(DEVICE):
        pytest.skip("Triton cannot run here")
    from specgen.decoding.fused import FusedDecoder

    return FusedDecoder(model, **kwargs)


# On a GPU "cuda" replays graphs (and "fused" too); on a CPU it runs eagerly.
DECODERS = {"cuda": CudaDecoder, "cuda-static": lambda m: CudaDecoder(m, static=True),
            "fused": fused}


def one_token_logits(make, model, prefix: torch.Tensor) -> torch.Tensor:
    """The logits after `prefix` as plain decoding on the same decoder computes them: the
    prompt's pass, then one token a pass."""
    decoder = make(model)
    decoder.logits(prefix[:-3], 1)
    for token in prefix[-3:-1]:
        decoder.logits(token.view(1), 1)
    return decoder.logits(prefix[-1:], 1)[0]


def same(a: torch.Tensor, b: torch.Tensor, exact: bool) -> None:
    if exact:
        assert torch.equal(a, b)
    else:  # PyTorch's attention sums a masked row in another order than a shorter one
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", DECODERS)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@torch.inference_mode()
def test_every_node_is_the_one_token_pass_of_its_branch(kind, family, dtype, tiny_model):
    make = DECODERS[kind]
    exact = kind == "fused"
    if dtype != torch.float32 and not exact:
        pytest.skip("PyTorch's attention: to rounding, checked in fp32")
    model = tiny_model(family, vocab=64, hidden=64, layers=2).to(DEVICE, dtype)
    decoder = make(model)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 64, (9,), generator=g).to(DEVICE)
    decoder.logits(prompt[:-1], 1)  # the cache holds all but the pending token
    tokens = torch.randint(0, 64, (len(PARENTS),), generator=g).to(DEVICE)
    tokens[0] = prompt[-1]
    tree = Tree(tokens, PARENTS, (-1,) * len(PARENTS))
    got = decoder.tree_logits(tree.tokens, tree.parents)
    for node in range(len(PARENTS)):
        branch = tokens[[0, *tree.path(node)]]
        same(got[node], one_token_logits(make, model, torch.cat([prompt[:-1], branch])), exact)
    decoder.keep_branch(KEPT)
    assert decoder.length == len(prompt) + len(KEPT)
    five = torch.tensor([5], device=DEVICE)
    after = decoder.logits(five, 1)[0]
    same(after, one_token_logits(make, model, torch.cat([prompt, tokens[KEPT], five])), exact)
    # a tree whose kept branch is its chain leaves the chain's entries where they are
    again = make(model)
    again.logits(prompt[:-1], 1)
    again.tree_logits(tree.tokens, tree.parents)
    again.keep_branch([1, 2, 3])
    chain = make(model)
    chain.logits(prompt[:-1], 1)
    chain.logits(tokens[:4], 4)
    seven = torch.tensor([7], device=DEVICE)
    same(again.logits(seven, 1), chain.logits(seven, 1), exact)


@pytest.mark.skipif(DEVICE != "cpu", reason="the stand-in capture runs on the CPU")
@torch.inference_mode()
def test_one_graph_per_width_serves_every_tree_of_that_width(tiny_model, fake_graphs):
    """A generator that may build trees reserves their graphs (widths 2..MAX_TREE_ROWS) with
    the others; a tree of another shape and the same width replays the same graph, with
    the eager captured form's bits."""
    model = tiny_model("llama", vocab=64, hidden=64, layers=2)
    decoder, eager = CudaDecoder(model), CudaDecoder(model, static=True)
    captured = fake_graphs(decoder)
    decoder.reserve(40, 9, trees=True)
    variants = {*DEFAULT_VARIANTS, TREE_VARIANT}
    assert captured == list(graph_keys(variants, 9))
    assert [key[0] for key in captured if key[-1]] == list(range(2, MAX_TREE_ROWS + 1))
    before = len(captured)
    ids = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(2))
    for parents in (PARENTS, (-1, 0, 1, 0, 3, 4, 0, 6, 6)):  # two shapes of 9 nodes
        for d in (decoder, eager):
            d.reset()
            d.logits(ids[:8], 1)
        assert torch.equal(decoder.tree_logits(ids[8:17], parents),
                           eager.tree_logits(ids[8:17], parents))
        decoder.keep_branch([1, 2]), eager.keep_branch([1, 2])
    assert len(captured) == before


def every_branch(self, scores, tokens, k):
    """Planner.branches with every candidate worth its row: each step is a full tree."""
    chosen = choose_branches(scores, tokens, 0.0, MAX_TREE_ROWS - 1 - k)
    self.branch_offer = sum(score for _, _, score in chosen)
    return [(index, token) for index, token, _ in chosen]


@pytest.mark.parametrize("kind", DECODERS)
def test_greedy_output_with_trees_is_the_decoders_own_greedy_output(kind, tiny_pair, monkeypatch):
    monkeypatch.setattr(Planner, "branches", every_branch)
    make = DECODERS[kind]
    target, draft = tiny_pair("llama")
    if DEVICE != "cpu":  # the pair is shared by other tests: moved as a copy
        target, draft = copy.deepcopy(target).to(DEVICE), copy.deepcopy(draft).to(DEVICE)
    prompt = torch.tensor([3, 14, 15, 9, 2, 6], device=DEVICE)
    plain = make(target)
    with torch.inference_mode():
        token, want = plain.logits(prompt).argmax(-1), []
        for _ in range(30):
            want.append(int(token))
            token = plain.logits(token).argmax(-1)
    gen = SpeculativeGenerator(target, ModelDrafter(draft, target.config.vocab_size), 4, False)
    gen._decoder = make(target)
    gen.drafter.lm.decoder = CudaDecoder(draft)
    result = gen.generate(prompt, max_new_tokens=30)
    assert result.token_ids == want
    assert result.stats.tree_steps > (result.stats.target_passes - 1) // 2
    assert result.stats.branch_kept > 0
