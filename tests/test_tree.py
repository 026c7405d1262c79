"""Token trees: their layout, a tree verify pass whose every row is the one-token pass along
its branch (bit for bit, on a target), exact sampling down a tree, and the engine's output."""

import copy
from collections import Counter

import pytest
import torch

import specgen.core.engine
from specgen import SpeculativeGenerator
from specgen.choices import MAX_TREE_ROWS
from specgen.core import tree as trees
from specgen.core.adaptive import Planner
from specgen.core.base import Drafter
from specgen.core.drafters import ModelDrafter
from specgen.core.step import Plan, Step
from specgen.core.sampling import SamplingParams, sample
from specgen.core.tree import Tree, build, choose_branches, rejection_walk
from specgen.decoding import LeanDecoder, make_decoder
from specgen.decoding.lean import segments
from specgen.kernels import prepare, rows
from specgen.loading import stored


def test_segments_are_the_chain_runs_of_a_preorder_tree():
    assert segments([-1, 0, 1, 2]) == ([(0, 4, 0)], [0, 1, 2, 3])  # a chain: one run
    # root, d1, d2, d3 | a branch at depth 3 | at depth 2 | at depth 1
    assert segments([-1, 0, 1, 2, 2, 1, 0]) == (
        [(0, 4, 0), (4, 5, 3), (5, 6, 2), (6, 7, 1)], [0, 1, 2, 3, 3, 2, 1])
    # a branch with a child of its own continues its run
    assert segments([-1, 0, 1, 0, 3]) == ([(0, 3, 0), (3, 5, 1)], [0, 1, 2, 1, 2])


def test_build_puts_branches_after_the_chain_deepest_first():
    tree = build(torch.tensor(9), torch.tensor([4, 5, 6]), [(0, 7), (2, 8), (1, 3)])
    assert tree.tokens.tolist() == [9, 4, 5, 6, 8, 3, 7]
    assert tree.parents == (-1, 0, 1, 2, 2, 1, 0)
    assert segments(tree.parents)[1] == [0, 1, 2, 3, 3, 2, 1]  # the depths
    assert tree.drawn_from == (-1, 0, 1, 2, -1, -1, -1)
    assert tree.path(5) == [1, 5] and tree.path(3) == [1, 2, 3] and tree.path(0) == []


def test_branches_are_ranked_by_the_chance_of_reaching_them():
    q = torch.tensor([[0.6, 0.3, 0.1, 0.0],   # d1 = 0; alternatives 1 (0.3), 2 (0.1)
                      [0.0, 0.5, 0.5, 0.0]])  # d2 = 1, reached with 0.6; alternative 2 (0.3)
    scores, tokens = trees.branch_scores(q, torch.tensor([0, 1]), per_depth=2)
    torch.testing.assert_close(scores, torch.tensor([[0.3, 0.1], [0.3, 0.0]]))
    assert tokens[0].tolist() == [1, 2] and tokens[1, 0].item() == 2
    chosen = choose_branches(scores, tokens, floor=0.05, budget=2)
    assert [(i, t) for i, t, _ in chosen] == [(0, 1), (1, 2)]
    assert [round(s, 6) for _, _, s in chosen] == [0.3, 0.3]
    assert [(i, t) for i, t, _ in choose_branches(scores, tokens, floor=0.2, budget=5)] == [
        (0, 1), (1, 2)]
    assert choose_branches(scores, tokens, floor=0.5, budget=5) == []
    assert choose_branches(scores, tokens, floor=0.0, budget=0) == []


def one_token_logits(model, prefix: torch.Tensor) -> torch.Tensor:
    """The target's logits after `prefix`, as plain decoding computes them: the prompt's
    pass, then one token a pass."""
    decoder = make_decoder(model, exact=True)
    decoder.logits(prefix[:-3], 1)
    for token in prefix[-3:-1]:
        decoder.logits(token.view(1), 1)
    return decoder.logits(prefix[-1:], 1)[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8-dyn", "int4-dyn", "gguf"])
@torch.inference_mode()
def test_every_row_of_a_tree_pass_is_the_one_token_pass_of_its_branch(dtype, tiny_model,
                                                                        tiny_gguf, tmp_path):
    """The guarantee a tree keeps: whatever the tree's shape, node j's logits are, bit for
    bit, those plain decoding computes after the prompt and node j's branch. After the
    accepted branch is kept, the next pass continues exactly as plain decoding does. (A
    GGUF model's chains take a layer a call, its trees the loop of ops.)"""
    model = tiny_model("qwen2", vocab=64, hidden=64, layers=2)
    if dtype == "gguf":
        path = tiny_gguf(tmp_path / "m.gguf", hidden=64, ff=128, arch="qwen2", kind="Q8_0")
        model = prepare(stored.load(path), "target", "gguf")
    elif dtype.endswith("-dyn"):
        prepare(model, "target", dtype)
    else:
        prepare(model.to(getattr(torch, dtype)), "target")
    assert dtype == "bfloat16" or rows.library() is not None
    decoder = make_decoder(model, exact=True)
    assert isinstance(decoder, LeanDecoder)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 64, (9,), generator=g)
    decoder.logits(prompt[:-1], 1)  # the cache holds all but the pending token
    # root, chain d1..d4, a branch at depth 4, a branch with a child at depth 2, one at 1
    parents = (-1, 0, 1, 2, 3, 3, 1, 6, 0)
    tokens = torch.randint(0, 64, (len(parents),), generator=g)
    tokens[0] = prompt[-1]
    tree = Tree(tokens, parents, (-1,) * len(parents))
    got = decoder.tree_logits(tree.tokens, tree.parents)
    for node in range(len(parents)):
        branch = tokens[[0, *tree.path(node)]]
        want = one_token_logits(model, torch.cat([prompt[:-1], branch]))
        assert torch.equal(got[node], want), f"node {node} differs from its one-token pass"
    decoder.keep_branch(tree.path(7))  # root, 1, 6, 7 accepted: the cache holds them
    assert decoder.length == len(prompt) + 3
    after = decoder.logits(torch.tensor([5]), 1)[0]
    want = one_token_logits(model, torch.cat([prompt, tokens[[1, 6, 7]], torch.tensor([5])]))
    assert torch.equal(after, want)


def test_sampling_down_a_tree_emits_the_target_distribution(distribution):
    """The first token a tree step emits is distributed as the target's, whether it is the
    chain's draft (drawn from q), a branch (chosen from q's top tokens), or drawn after
    every child was rejected; a walk that tries the branches against p itself (no residual
    after a rejection) is caught by the same test."""
    vocab = 6
    g = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn(5, vocab, generator=g) * 1.5, -1)  # one per node
    q = torch.softmax(torch.randn(2, vocab, generator=g) * 1.5, -1)

    def tree_for(generator) -> Tree:
        drafts = torch.stack([sample(q[0], generator), sample(q[1], generator)])
        scores, tokens = trees.branch_scores(q, drafts, per_depth=2)
        # depth 1's two alternatives only: nodes 0 root, 1 d1, 2 d2, 3 and 4 branches of d1
        return build(torch.tensor(0), drafts, [(0, int(tokens[0, 0])), (0, int(tokens[0, 1]))])

    def draw(walk, samples):
        gen = torch.Generator().manual_seed(1)
        counts: Counter = Counter()
        tried: Counter = Counter()
        for _ in range(samples):
            tree = tree_for(gen)
            node, token = walk(p, q, tree, gen)
            path = tree.path(node)
            first = int(tree.tokens[path[0]]) if path else int(token)
            counts[(first,)] += 1
            tried[path[0] if path else 0] += 1
        return counts, tried

    counts, tried = draw(rejection_walk, distribution.SAMPLES)
    # the chain's draft, a branch, and the draw after all (a branch the draft favours more
    # than the target is never kept after the chain's rejection: the residual has no mass there)
    assert {0, 1} <= set(tried) and set(tried) & {3, 4}
    joint = {(t,): p[0, t].item() for t in range(vocab)}
    pvalue = distribution.chi_square_pvalue(counts, joint)
    assert pvalue > distribution.ALPHA, f"a tree's first token differs from the target (p = {pvalue:.2e})"

    def no_residual(p, q, tree, generator=None):
        for child in tree.children(0):
            x = int(tree.tokens[child])
            proposal = q[0, x] if tree.drawn_from[child] >= 0 else 1.0
            if torch.rand(1, generator=generator) * proposal < p[0, x]:
                return child, sample(p[child], generator)
        return 0, sample(p[0], generator)

    counts, _ = draw(no_residual, 2000)
    assert distribution.chi_square_pvalue(counts, joint) < distribution.ALPHA


def every_branch(self, scores, tokens, k):
    """Planner.branches with every candidate worth its row: each step is a full tree."""
    chosen = choose_branches(scores, tokens, 0.0, MAX_TREE_ROWS - 1 - k)
    self.branch_offer = sum(score for _, _, score in chosen)
    return [(index, token) for index, token, _ in chosen]


@pytest.mark.parametrize("family, method", [("llama", "draft-model"), ("qwen2", "draft-model"),
                                            ("llama", "self")])
def test_greedy_output_with_trees_is_the_targets_greedy_output(family, method, tiny_pair,
                                                              monkeypatch):
    """Also where the target drafts for itself (self: its draft passes write the target's
    own cache, which the tree's pass then overwrites)."""
    monkeypatch.setattr(Planner, "branches", every_branch)
    target, draft = tiny_pair(family)
    prompt = torch.tensor([[3, 14, 15, 9, 2, 6]])
    want = target.generate(prompt, max_new_tokens=40, do_sample=False)[0, prompt.shape[1]:]
    gen = SpeculativeGenerator(target, draft, num_speculative_tokens=4, adaptive=False,
                               method=method)
    result = gen.generate(prompt, max_new_tokens=40)
    assert result.token_ids == want.tolist()
    # a step is a tree wherever the draft had an alternative worth anything (never at odds 1)
    assert result.stats.tree_steps > (result.stats.target_passes - 1) // 2
    assert result.stats.branch_kept > 0  # and some kept a branch the chain did not have
    again = SpeculativeGenerator(target, draft, num_speculative_tokens=4, adaptive=False,
                                 method=method, tree=False).generate(prompt, max_new_tokens=40)
    assert again.token_ids == want.tolist() and again.stats.tree_steps == 0


@pytest.mark.parametrize("head_rows", [None, 12])
def test_sampled_output_with_trees_has_the_target_distribution(head_rows, distribution,
                                                               monkeypatch):
    """Through the engine: trees on every step, three tokens' joint distribution against the
    target's own, also with a draft over part of the vocabulary (q zero-padded to the
    target's); a walk without the residual after a rejection is caught by the same test."""
    monkeypatch.setattr(Planner, "branches", every_branch)
    target, draft = distribution.tiny_pair("qwen2")
    params = SamplingParams(1.0, top_k=6)
    joint = distribution.target_joint(target, distribution.PROMPT, 3, params)
    drafter = ModelDrafter(draft, target.config.vocab_size, head_rows=head_rows)
    gen = SpeculativeGenerator(target, drafter, num_speculative_tokens=2, adaptive=False)
    samples, sources = distribution.draw(gen, 3, params)
    assert gen.stats.tree_steps and min(sources.values()) > distribution.SAMPLES // 50
    pvalue = distribution.chi_square_pvalue(samples, joint)
    assert pvalue > distribution.ALPHA, f"tree samples differ from the target (p = {pvalue:.2e})"

    def no_residual(p, q, tree, generator=None):
        node = 0
        while children := tree.children(node):
            for child in children:
                x = int(tree.tokens[child])
                proposal = q[tree.drawn_from[child], x] if tree.drawn_from[child] >= 0 else 1.0
                if torch.rand(1, generator=generator) * proposal < p[node, x]:
                    node = child
                    break
            else:
                return node, sample(p[node], generator)
        return node, sample(p[node], generator)

    monkeypatch.setattr(specgen.core.engine, "rejection_walk", no_residual)
    if head_rows is None:
        samples, _ = distribution.draw(gen, 3, params, samples=2000)
        assert distribution.chi_square_pvalue(samples, joint) < distribution.ALPHA


def test_the_planner_branches_where_a_row_costs_less_than_what_the_branch_is_worth():
    """A branch's worth is its score in tokens (scaled by how branches have held); its price
    is the verify pass's measured cost of one more row, in tokens at the recent rate."""
    scores = torch.tensor([[0.40, 0.10, 0.01], [0.20, 0.05, 0.0]])
    tokens = torch.tensor([[5, 6, 7], [8, 9, 10]])
    planner = Planner(4)
    assert planner.branches(scores, tokens, 2) == []  # nothing measured: no rate to price by
    planner.steps.append((2, 2.0))  # a token a second
    planner.verify_cost.update({0: 1.0, 1: 1.0, 2: 1.0})  # flat: rows look free
    assert planner.branches(scores, tokens, 2) == [(0, 5), (1, 8), (0, 6), (1, 9)]  # not 0.01
    planner.verify_cost.update({1: 1.0, 2: 1.25})  # a quarter of a token a row
    assert planner.branches(scores, tokens, 2) == [(0, 5)]
    assert planner.branch_offer == pytest.approx(0.40)
    # branches have held better than the draft's odds said: the same price buys more
    tree = build(torch.tensor(1), torch.tensor([2, 3]), [(0, 5)])
    for _ in range(3):
        planner.observe(Step(Plan(None, None, 0), 0, 0, 0.0, 1.0))  # plain steps keep the rate
    draft = type("Draft", (Drafter,), {
        "ends_own_drafts": True,
        "guessers": lambda self, tokens: {"m": self},
        "propose": lambda self, tokens, k, params, generator, stop_below=0.0: (
            torch.tensor([2, 3][:k]), None)})()
    planner.observe(Step(Plan("m", draft, 2), 2, 1, 0.1, 1.25, chain=0, tree=tree))  # a branch kept
    assert planner.branch_odds > 1.0
    assert (0, 5) in planner.branches(scores, tokens, 2)
    assert not Planner(4, adaptive=False).branches(scores, tokens, 2)
    assert len(Planner(4).branches(scores, tokens, MAX_TREE_ROWS - 1)) == 0  # no room


@pytest.mark.parametrize("kind, draft_vocab", [("eagle", None), ("eagle3", 48), ("medusa", None)])
@pytest.mark.parametrize("decoder", ["lean", "cuda"])
def test_trees_from_a_head_give_the_targets_greedy_output(kind, draft_vocab, decoder,
                                                          fitted_head, monkeypatch):
    """A head's q ranks its branches; after a tree the target's capture keeps the kept
    branch's states, which the head reads next (on the CPU's decoder and the GPU's)."""
    from specgen.core.drafters import make_drafter
    from specgen.decoding.cuda import CudaDecoder

    monkeypatch.setattr(Planner, "branches", every_branch)
    target, head = fitted_head(kind, draft_vocab=draft_vocab)
    target = copy.deepcopy(target)  # prepared for the lean decoder: the cached one stays as it is
    kept = 0
    for seed in range(3):
        prompt = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(seed))
        want = target.generate(prompt, do_sample=False, max_new_tokens=40, min_new_tokens=40)
        drafter = make_drafter(kind, None, target.config.vocab_size, head=head)
        gen = SpeculativeGenerator(target, drafter, 4, adaptive=False)
        assert hasattr(gen._decoder, "tree_logits")
        if decoder == "cuda":
            gen._decoder = CudaDecoder(target, static=True)
            drafter.bind_target(gen._decoder, target)
        result = gen.generate(prompt, max_new_tokens=40)
        assert result.token_ids == want[0, 9:].tolist()
        assert result.stats.tree_steps > (result.stats.target_passes - 1) // 2
        kept += result.stats.branch_kept
    assert kept > 0


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_sampled_output_with_trees_from_a_head_has_the_target_distribution(kind, distribution,
                                                                           fitted_head, monkeypatch):
    from specgen.core.drafters import make_drafter

    monkeypatch.setattr(Planner, "branches", every_branch)
    target, head = fitted_head(kind, vocab=16, layers=2, hidden=32, scale=10.0)
    target = copy.deepcopy(target)
    params = SamplingParams(1.0)
    joint = distribution.target_joint(target, distribution.PROMPT, 3, params)
    drafter = make_drafter(kind, None, target.config.vocab_size, head=head)
    gen = SpeculativeGenerator(target, drafter, 2, adaptive=False)
    samples, sources = distribution.draw(gen, 3, params, samples=3000)
    assert gen.stats.tree_steps and min(sources.values()) > 60
    pvalue = distribution.chi_square_pvalue(samples, joint)
    assert pvalue > distribution.ALPHA, f"{kind}: tree samples differ from the target (p = {pvalue:.2e})"


@pytest.mark.parametrize("decoder", ["lean", "cuda", "fused"])
def test_after_trees_a_head_holds_the_true_states_of_every_kept_position(decoder, fitted_head,
                                                                        monkeypatch):
    """What makes a head draft well after a tree kept a branch (the output is exact either
    way): its store holds, for every position, the state a plain pass over the final text
    gives there, the branch's rows included, not the tree's rows in the tree's order."""
    from specgen.core.drafters import make_drafter
    from specgen.decoding.cuda import CudaDecoder

    monkeypatch.setattr(Planner, "branches", every_branch)
    target, head = fitted_head("eagle")
    target = copy.deepcopy(target)
    for seed in range(6):  # until a branch was kept (so a tree's rows were reordered)
        drafter = make_drafter("eagle", None, target.config.vocab_size, head=head)
        gen = SpeculativeGenerator(target, drafter, 4, adaptive=False)
        if decoder != "lean":  # the GPU's decoders in their captured form (fused: in Triton's
            gen._decoder = (CudaDecoder(target, static=True) if decoder == "cuda"  # interpreter)
                            else fused_decoder(target, static=True))
            drafter.bind_target(gen._decoder, target)
        prompt = torch.randint(0, 64, (9,), generator=torch.Generator().manual_seed(seed))
        if gen.generate(prompt, max_new_tokens=40).stats.branch_kept:
            break
    assert gen.stats.branch_kept > 0
    drafter.rollback(len(gen._tokens) - 1)
    text = gen._tokens[:-1]
    with torch.no_grad():
        want = target.base_model(input_ids=text[None]).last_hidden_state[0]
    stored = drafter._feats
    assert drafter._start + stored.shape[0] == len(text)
    torch.testing.assert_close(stored, want[drafter._start:], atol=1e-5, rtol=1e-4)


def fused_decoder(model, **kwargs):
    pytest.importorskip("triton")
    from specgen.decoding.fused import FusedDecoder
    from specgen.kernels import gpu

    if not gpu.available("cpu"):
        pytest.skip("Triton's interpreter is off")
    return FusedDecoder(model, **kwargs)
