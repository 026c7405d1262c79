"""A GGUF model's linear layers computed from the file as stored (kernels/gguf.py): every
layer's q, k, v, o, gate, up and down projections and the output head (the embedding where
the head is tied), summed per pass of M rows, on each path this CPU has.

    python bench/gguf_linears.py /tmp/gg/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf [--threads 2]
        [--rows 1 2 5 9] [--rounds 5]

Passes are interleaved by specgen's bench harness (every path and width once a round, the
order rotated), and each is timed by the wall clock and by this process's CPU time: on a
machine whose cores are shared, the wall clock also counts the time spent waiting for a core. Prints the minimum and the median.
"""

from __future__ import annotations

import argparse
import resource

import gguf as gguf_file
import torch

from specgen.bench.harness import interleave, median
from specgen.kernels import gguf

LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def weights(path: str) -> list[gguf.GGUFWeight]:
    tensors = {t.name: t for t in gguf_file.GGUFReader(path).tensors}
    names = [n for n, t in tensors.items()
             if n.startswith("blk.") and n.split(".")[2] in LINEARS and n.endswith(".weight")]
    names.append("output.weight" if "output.weight" in tensors else "token_embd.weight")
    out = []
    for name in names:
        t = tensors[name]
        out.append(gguf.wrap(t.tensor_type.name, t.data, int(t.shape[1]), int(t.shape[0])))
    return out


def cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 9])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ws = weights(args.path)
    kinds = sorted({w.kind for w in ws})
    print(f"{len(ws)} linears, {sum(w.data.nbytes for w in ws) / 1e6:.0f} MB ({', '.join(kinds)}),"
          f" {args.threads} threads")
    torch.manual_seed(0)
    xs = {w.k: torch.randn(max(args.rows), w.k) for w in ws}
    for w in ws:  # every page of the file touched once
        gguf.linear(xs[w.k][:1], w)
    keys = [(p, m) for p in gguf.paths() for m in args.rows]

    def call(key: tuple[int, int], _prompt: int, _round: int) -> float:
        """Every linear once over M rows on one path; the CPU seconds it took."""
        p, m = key
        c0 = cpu_seconds()
        for w in ws:
            gguf.linear(xs[w.k][:m], w, path=p)
        return cpu_seconds() - c0

    trials = interleave(keys, 1, call, repeats=args.rounds)
    wall = {key: [t.seconds for t in trials if t.name == key] for key in keys}
    cpu = {key: [t.value for t in trials if t.name == key] for key in keys}
    names = {gguf.AVX2: "AVX2", gguf.VNNI: "VNNI", gguf.AMX: "AMX"}
    for p, m in keys:
        w, c = wall[p, m], cpu[p, m]
        print(f"{names[p]:4s} M={m:<2d} wall min {1e3 * min(w):7.1f} ms, median "
              f"{1e3 * median(w):7.1f} ms; CPU median {1e3 * median(c):7.1f} ms")


if __name__ == "__main__":
    main()
