"""The fused decoder's kernels compiled for sm_90 (H100, H200) on a machine without a GPU:
per model shape, each kernel a pass launches at its production launch configuration, with the
registers, spills, stack and shared memory the compiled kernel needs and its CTAs (the grid).

    python bench/gpu_kernels.py [--doc docs/gpu-kernels.md] [--json rows.json]

Needs Triton with its NVIDIA backend (it ships ptxas and cuobjdump) and its interpreter off.
The shapes are bench/gpu.py's; the launches come from the decoder's own code
(specgen.decoding.fused_offline). docs/gpu-kernels.md is this script's output, not edited by
hand; tests/test_gpu_kernels.py checks the document against a fresh run.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "gpu-kernels.md"
WIDTH = 33  # the widest graph (GRAPH_WIDTH); M is not specialized, so any width gives these


def shapes() -> dict[str, tuple]:
    """bench/gpu.py's SHAPES, read from its source (importing it would pull in its run)."""
    tree = ast.parse((ROOT / "bench" / "gpu.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SHAPES":
            return ast.literal_eval(node.value)
    raise LookupError("bench/gpu.py has no SHAPES")


# name in the table: (bench/gpu.py shape, int4-gpu linears)
MODELS = {
    "0.5B": ("qwen2.5-coder-0.5b", False),
    "1.5B": ("qwen2.5-coder-1.5b", False),
    "1B": ("llama-3.2-1b", False),
    "8B": ("llama-3.1-8b", False),
    "70B int4": ("llama-3.1-70b", True),
}


def rows() -> list[dict]:
    from specgen.decoding import fused_offline as offline

    all_shapes = shapes()
    out = []
    for model, (name, int4) in MODELS.items():
        chain = offline.launches(all_shapes[name], WIDTH, int4)
        tree = offline.launches(all_shapes[name], WIDTH, int4, tree=True)
        ops = [(t, False) for t in chain] + [(t, True) for t in tree
                                             if t.op in ("qkv", "attention")]
        for launch, tree_pass in ops:  # a tree pass differs from a chain's in these two
            int4 = launch.kernel == "_linear_int4"
            got = offline.measure(launch, with_sass=int4)
            per_weight = offline.instructions_per_weight(got) if int4 else None
            out.append(dict(
                model=model, op=launch.op + (" (tree)" if tree_pass else ""),
                kernel=launch.kernel, warps=got.num_warps, stages=got.num_stages,
                regs=got.regs, spills=got.spills, stack=got.stack, shared=got.shared,
                ctas=launch.ctas, grid=list(launch.grid), hash=got.hash[:12],
                n=launch.args.get("N"), k=launch.args.get("K"),
                split=launch.grid[1] if launch.kernel.startswith("_linear") else None,
                per_weight=per_weight))
    return out


def weight(per: list | tuple | None) -> str:
    return "" if per is None else f"{per[0]:.2f} ({per[1]:.2f})"


def render(table: list[dict]) -> str:
    lines = [
        "# The GPU kernels compiled for sm_90",
        "",
        "Written by `python bench/gpu_kernels.py --doc docs/gpu-kernels.md` (do not edit by "
        "hand); `tests/test_gpu_kernels.py` compares it with a fresh run.",
        "",
        "Every kernel the fused decoder (`decoding/fused.py`) launches for one decoder layer, "
        "the final norm and the output head, recorded from the decoder's own code at each "
        "model's shape (`bench/gpu.py`'s) with Triton's binder (the launch configuration it "
        "really uses: warps, stages, block sizes, argument specialization), then compiled for "
        "sm_90 to the end on a machine without a GPU (`specgen.decoding.fused_offline`). "
        "Registers per thread and the stack frame are read from the cubin (cuobjdump), spill "
        "bytes from ptxas' report on the same PTX, shared memory from Triton's metadata; "
        f"sm_90 allows {227} KB of shared memory a block and 255 registers a thread. CTAs: "
        f"the grid of a {WIDTH}-row pass (the rows' count is not specialized, so the binary is "
        f"the same for every width) with a cache of {4096} slots for attention. "
        "K parts: the split of a linear's inputs (`tiles.splits`, from N, K and 132 SMs). "
        "SASS / int4 weight: instructions in the int4 linear's main loop (from the cubin, "
        "cuobjdump) a thread issues per weight it streams: one trip's shortest path (a pass of "
        "one row tile, up to 16 rows) and, in brackets, the whole loop (three row tiles, a "
        "pass of 33 to 48 rows), over BLOCK_N x GROUP / threads weights. "
        "No figure here was measured on a GPU.",
        "",
        "## How the linears are built",
        "",
        "- **One binary for every width.** `M` (the pass's rows) is `do_not_specialize`d: "
        "Triton would otherwise compile again for M = 1 (a constant) and for M divisible by "
        "16 (an alignment hint). The tests compile passes of 1..33 rows and find one hash per "
        "kernel.",
        "- **Row tiles looped inside a program.** A program takes an output tile and a part "
        "of K and multiplies each weight tile it loads into each of the pass's row tiles of 16 "
        "(three: 48 rows; a pass of up to 33 rows is one group), so the grid, and the weights' "
        "one trip from memory, are the same for every graph width; a row's sums never depend "
        "on the other tiles.",
        "- **Split-K from N, K and the SM count.** `tiles.splits` cuts K into "
        "min(K steps, ceil(2 x SMs / output tiles)) parts, split j taking steps "
        "[j S / P, (j + 1) S / P): never a function of M. Each program writes its fp32 partial "
        "sums; the last program of an output tile to arrive (an atomic count, acquire-release "
        "at GPU scope after a barrier) adds the parts in order 0..P-1 and resets the count: "
        "one kernel a linear, and a row's bits the same in a pass of any width. Under the "
        "interpreter a CPU counts 2 SMs, so the tests' small shapes split too.",
        "- **int4 by the exponent trick.** Eight int4 values a word, input 2k in nibble k and "
        "2k + 1 in nibble k + 4 (`gpu.NIBBLE_INPUTS`): one shift and one LOP3 put both in the "
        "mantissas of a bf16 pair 0x4300 | q (the float 128 + q), and nothing more is done to "
        "a weight: no integer-to-float conversion, no subtraction, each word read once. A "
        "row's group sum is scale * (x . (q + 128)) + (zero - 136 scale) * (x . 1), the "
        "products in fp32 (x . 1 a product with a tile of ones: the same for every output, "
        "so the compiler keeps one HMMA of four), which is x . ((q - 8) * scale + zero) with "
        "no dequantized weight rounded, and every row computed alike. The price of leaving "
        "the 128 in: the fp32 sums carry values about 17 times larger than q - 8 before the "
        "offset cancels, so their rounding error is as much larger (in an fp32 emulation on "
        "a CPU, 8192 inputs: a mean 0.0025 of a bf16 unit in the last place, 0.15% of the "
        "outputs rounded one unit off from the exactly rounded value, against none with q - "
        "8; a dequantizing kernel that rounds each weight to bf16 errs far more). fp32 (the "
        "interpreter's tests) one value a register at 2^23, then minus 2^23 - 128: the same "
        "values q + 128 and the same sums as bf16, so the interpreter runs the code that "
        "compiles; fp16 at 2^10 with a packed subtract (q - 8: fp16's sums have fewer bits "
        "to spare). The exponent's bits are read from memory once a program, not written as "
        "a literal: ptxas otherwise rematerializes the literal in a register before each "
        "LOP3 under the kernel's register pressure (33 IMADs a trip more, measured at its 220 "
        "registers).",
        "- **Instructions per weight: 2.37, under the 2.5 aimed at.** An int4 program is "
        "256 outputs on 8 warps, 3 stages (128 weights of a group a thread). One row tile's "
        "trip through the loop runs 303 instructions for 128 weights in every int4 linear "
        "(2.36 to 2.37 a weight): 0.88 for the unpacking (3 shifts and 4 LOP3 a word of 8), "
        "0.31 for the products (32 HMMA for the weights, 8 for the row sums), 0.25 for "
        "scaling and adding a group (FFMA), 0.25 moving the unpacked tile through shared "
        "memory into the MMA operand layout (STS, LDSM: layouts Triton chooses), 0.06 for "
        "the inputs' tile (LDSM), the rest the group's scale and zero (two loads, then "
        "through shared memory into the accumulator's layout), the next group's asynchronous "
        "copy, the loop's addresses and barriers. It was 2.59 in o and down, 3.06 to 3.09 in "
        "q/k/v and gate/up; two changes that leave every output's bits as they were (compared "
        "in Triton's interpreter in fp32, fp16 and bf16): q/k/v and gate/up normalise their "
        "inputs once a program, before the loop (below), so their loop is o's (to "
        "2.51); and the loop's loads carry no masks (a weight row past N reads row N - 1, "
        "an input row past M row M - 1: their products land only in outputs and rows never "
        "stored, and a row's sums use its own inputs alone), which takes the predicates off "
        "each asynchronous copy (2.59 to 2.37). Measured and dropped: two groups a trip "
        "(the loop's fixed costs over 256 weights; the two unpacked tiles spill, 640 "
        "bytes); 2 stages "
        "instead of 3 (2.23, fewer registers and addresses), not taken: at these registers "
        "an SM holds one program, and 2 stages halve the weight bytes it has in flight (16 KB "
        "instead of 32), which no GPU here could weigh against the latency the copies must "
        "cover; the zero's product as a row sum of the inputs across threads (more "
        "instructions than the HMMAs it saves); 256 outputs on 4 warps (spills). Left: the "
        "unpacked weights straight into the MMA's operand registers (Marlin's pre-permuted "
        "fragments; Triton keeps its shared-memory round trip), about 0.25 a weight.",
        "- **SiLU in the down projection's loads (bf16).** `linear(gate_up, down, gated=True)` "
        "computes silu(gate) * up as it loads its inputs, rounded as the SiLU kernel rounds "
        "(the tests compare the bits). Every output tile recomputes it, "
        "so an int4 down projection does not take it: folded in, its loop "
        "measured 10.6 instructions a weight against 3.5 (the loop of then), more than an "
        "H100 can issue while "
        "streaming int4 weights (about 5 a weight at 3.35 TB/s and 1.76 GHz).",
        "- **SiLU in the int4 gate/up projection's epilogue.** `linear(h, gate_up, "
        "silu=True)`: a tile of BLOCK_N loads the gate rows of BLOCK_N / 2 outputs and the "
        "up rows of the same outputs (interleaved at load, the weight as stored), and its "
        "epilogue (or split-K's last program, after adding the parts in order) stores "
        "silu(gate) * up with the rounding of the linear then the SiLU kernel (the tests "
        "compare the bits): once an output, no instruction in the main loop.",
        "- **The attention merge in the attention kernel.** `_attend_chunk`'s programs each "
        "leave a chunk's running max, sum and output; the last of a (key/value head, row "
        "tile)'s programs to arrive (an atomic count, as split-K's) merges every row of the "
        "tile over its chunks in slot order, 16 chunks a step, and resets the count: the "
        "merge's order is fixed by the slots whichever program runs it.",
        "- **RMSNorm in the q/k/v and gate/up linears' loads (bf16 and int4).** `norm_linear` "
        "adds the residual and normalises as it loads its inputs, rounded as the norm kernel "
        "rounds; each program first sums each of its rows' squares over the whole of K, "
        "128 inputs a block, the blocks in order (`reference.norm_linear`), so every part "
        "of a split K scales a row alike, and the first output tile's programs store "
        "x + residual for the stream. bf16 normalises in the loop's loads; int4 normalises "
        "its rows' inputs over its part of K once, before the loop, into a scratch [M, K] "
        "(`_normed_part`: every program that stores an input there stores the same bits, "
        "and reads back only inputs it stored, after a barrier), which the loop reads as "
        "o's loop reads its inputs: none of the norm's instructions in the loop (in the loop "
        "it cost about 0.5 a weight). The price: every program reads its rows' inputs and "
        "residual over all of K (through L2), and in int4 writes and reads back its part, "
        "a traffic that grows with the rows (not measured on a GPU).",
        "- **RoPE and the cache write in the q/k/v linear's epilogue.** `norm_linear(..., "
        "qkv, rope=Rope(...))`: a tile of BLOCK_N loads the rows of the first halves of "
        "BLOCK_N / 2 (head, input) pairs and the rows of their second halves (interleaved at "
        "load, the weight as stored), and its epilogue (or split-K's last program, after "
        "adding the parts in order) rounds them as the linear does, rotates q and k at each "
        "row's position (a tree's row at its depth's) with `_rope_write`'s rounding, and "
        "stores q and writes k and v to the cache at the row's slot (the tests compare q and "
        "the cache bit for bit with the two kernels). Five kernels a layer in bf16 and in "
        "int4 (q/k/v, attention, o, gate/up, down), chain and tree passes alike "
        "(`tests/test_gpu_kernels.py` counts them in the decoder's launch list).",
        "",
        "## The table",
        "",
        "| model | op | kernel | warps | stages | registers | spills (B) | stack (B) "
        "| shared (KB) | CTAs | N | K | K parts | SASS / int4 weight |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['model']} | {r['op']} | `{r['kernel']}` | {r['warps']} | {r['stages']} "
            f"| {r['regs']} | {r['spills']} | {r['stack']} | {r['shared'] / 1024:.1f} "
            f"| {r['ctas']} | {r['n'] if r['n'] is not None else ''} "
            f"| {r['k'] if r['k'] is not None else ''} "
            f"| {r['split'] if r['split'] is not None else ''} "
            f"| {weight(r['per_weight'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--doc", type=Path, help="write the markdown table here")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("run with Triton's interpreter off (unset TRITON_INTERPRET)")
    table = rows()
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))
    text = render(table)
    if args.doc:
        args.doc.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
