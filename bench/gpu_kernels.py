"""The fused decoder's kernels compiled for sm_90 (H100, H200) on a machine without a GPU:
per model shape, each kernel a pass launches at its production launch configuration, with the
registers, spills, stack and shared memory the compiled kernel needs and its CTAs (the grid).

    python bench/gpu_kernels.py [--doc docs/gpu-kernels.md] [--json rows.json]

Needs Triton with its NVIDIA backend (it ships ptxas and cuobjdump) and its interpreter off.
The shapes are bench/gpu.py's; the launches come from the decoder's own code
(specgen.kernels.gpu.offline). docs/gpu-kernels.md is this script's output, not edited by
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
    from specgen.kernels.gpu import offline

    all_shapes = shapes()
    out = []
    for model, (name, int4) in MODELS.items():
        chain = offline.launches(all_shapes[name], WIDTH, int4)
        tree = offline.launches(all_shapes[name], WIDTH, int4, tree=True)
        ops = [(t, False) for t in chain] + [(t, True) for t in tree
                                             if t.op in ("rope", "attention")]
        for launch, tree_pass in ops:  # a tree pass differs from a chain's in these two
            got = offline.measure(launch)
            out.append(dict(
                model=model, op=launch.op + (" (tree)" if tree_pass else ""),
                kernel=launch.kernel, warps=got.num_warps, stages=got.num_stages,
                regs=got.regs, spills=got.spills, stack=got.stack, shared=got.shared,
                ctas=launch.ctas, grid=list(launch.grid), hash=got.hash[:12],
                n=launch.args.get("N"), k=launch.args.get("K")))
    return out


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
        "sm_90 to the end on a machine without a GPU (`specgen.kernels.gpu.offline`). "
        "Registers per thread and the stack frame are read from the cubin (cuobjdump), spill "
        "bytes from ptxas' report on the same PTX, shared memory from Triton's metadata; "
        f"sm_90 allows {227} KB of shared memory a block and 255 registers a thread. CTAs: "
        f"the grid of a {WIDTH}-row pass (the rows' count is not specialized, so the binary is "
        f"the same for every width) with a cache of {4096} slots for attention. "
        "No figure here was measured on a GPU.",
        "",
        "| model | op | kernel | warps | stages | registers | spills (B) | stack (B) "
        "| shared (KB) | CTAs | N | K |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['model']} | {r['op']} | `{r['kernel']}` | {r['warps']} | {r['stages']} "
            f"| {r['regs']} | {r['spills']} | {r['stack']} | {r['shared'] / 1024:.1f} "
            f"| {r['ctas']} | {r['n'] if r['n'] is not None else ''} "
            f"| {r['k'] if r['k'] is not None else ''} |")
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
