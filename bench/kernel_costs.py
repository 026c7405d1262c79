"""The CPU kernels' costs on this machine, side by side in one run: what a pass over M tokens
costs (M = 1 is a decoding step, M = K + 1 a verify pass), per kernel and per scheme.

    python bench/kernel_costs.py layers [--reps 15]
    python bench/kernel_costs.py model [--schemes gguf none int8-dyn int4-dyn] [--rounds 5]
    python bench/kernel_costs.py prompt [--tokens 100] [--rounds 5] [--threads 2]
    python bench/kernel_costs.py pieces [--widths 1 5] [--rounds 15] [--threads 2] [--model draft]
    python bench/kernel_costs.py kquants [--widths 1 2 3 5 8 9 16 17] [--rounds 7]
    python bench/kernel_costs.py stream [--widths 1 2 3 4 5] [--rounds 3] [--threads 2]

`layers`: ms per call of one linear layer of the demo target's shapes over M rows, its
weights streamed from memory: PyTorch's bf16 F.linear, specgen's row-alone C linear (bf16, on
each path this CPU has), int8-wo and int4-wo (PyTorch's packed matmuls), int8-dyn (fbgemm)
and int4-dyn (specgen's kernel, on each row-by-row path); then each scheme's relative error
on random weights. `model`: the demo target's forward as specgen runs it (the lean decoder
where it is exact), over M new tokens after 64 of context, per scheme, interleaved rounds,
each width relative to M = 1: the verify-cost curve the adaptive policy measures at run time.
`prompt`: the prompt's pass of the demo target as stored (its GGUF file, the lean decoder over
N tokens, logits of the last) on each GGUF kernel path this CPU has, beside llama.cpp's
prompt evaluation of the same file (llama-bench -p N -n 0 at the same thread count), rounds
alternating between them; wall clock and CPU time (llama-bench's CPU time per evaluation
counts its warm-up run and model load too: an upper bound).
`pieces`: where a wider pass of the demo target as stored (`--model draft`: the draft as the
default profile drafts with it, its output layer cut to `draft_vocab` rows, the logits of the
last token only) spends its extra time: each GGUF linear shape (all its calls in a pass, a
layer alone or the layers of one input as one call), the attention (rotary, cache write,
attention), the RMSNorms and everything else, per width, interleaved rounds, each piece's
minimum over rounds (wall clock, and the calling thread's CPU time, which a one-thread run
makes the work itself). The pieces are timed with the layers called op by op; the last row
is the pass as generation runs it, each layer one call (gguf.Layer).
`kquants`: what `gguf.c` costs per 512 weights (a pair of super-blocks) and pass on each path
this CPU has, per K-quant and width, weights hot in L2 (the work, without the memory), one
thread, CPU time, minimum over interleaved rounds: a pass's fixed cost and each token's.
`stream`: the GB/s at which `gguf.c` reads a layer of each of the demo pair's GGUF shapes over M
tokens on each path this CPU has, the layer's copies cycled through 600 MB (past the largest
L3 we have seen, 480 MB) so that every call reads from memory as a decoding step does; a
one-token pass is bound by how well its memory waits overlap its arithmetic.
Figures and what specgen adopted because of them: docs/cpu-kernels.md, docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specgen.bench.harness import interleave, median
from specgen.kernels import int4, linear, quantize
from specgen.kernels.quantize import QuantLinear, quantize_int4, quantize_int8

MS = (1, 2, 3, 5, 9, 17)
L3_BYTES = 96_000_000  # past the L3 of most machines we run on: copies past it stream
STREAM_BYTES = 600_000_000  # past the largest L3 we have seen (480 MB)
SHAPES = {  # (in, out) of Qwen2.5-Coder-1.5B's layers
    "mlp up/gate 1536->8960": (1536, 8960),
    "mlp down 8960->1536": (8960, 1536),
    "attn q/o 1536->1536": (1536, 1536),
    "lm_head 1536->151936": (1536, 151936),
}


def interleaved(variants: dict[object, Callable[[], object]], rounds: int
                ) -> dict[object, tuple[float, float]]:
    """(minimum, median) ms of one call of each variant per round, after a warm-up call each,
    through specgen's bench harness (the order rotated round by round, so that machine drift
    hits every variant alike). On a shared machine a call that loses a thread waits a whole
    time slice: the minimum estimates the work itself, the median shows the noise."""
    trials = interleave(list(variants), 1, lambda name, _p, _r: variants[name](), repeats=rounds,
                        warm_up=lambda name: variants[name]())
    ms = {name: [1e3 * t.seconds for t in trials if t.name == name] for name in variants}
    return {name: (min(times), median(times)) for name, times in ms.items()}


def rotating(make: Callable[[], object], nbytes: int) -> Callable[[], object]:
    """Enough copies of a layer's weights to exceed the L3 cache; each call takes the next,
    so the weights come from memory as they do in decoding."""
    copies = [make() for _ in range(max(1, -(-L3_BYTES // max(nbytes, 1))))]
    state = {"i": 0}

    def next_copy():
        state["i"] = (state["i"] + 1) % len(copies)
        return copies[state["i"]]
    return next_copy


def demo_target(quantization: str = "none"):
    """The demo profile's target alone, loaded and prepared as `specgen run` loads it (its
    converted and quantized copies come from specgen's cache)."""
    from specgen.loading.load import load_pair
    from specgen.profiles import load_profile, with_overrides

    prof = with_overrides(load_profile("qwen-coder-demo"), method="prompt-lookup",
                          target_quantization=quantization)
    return load_pair(prof).target


def demo_passes(role: str):
    """The demo pair's target (as stored, exact) or draft (as the default profile drafts):
    its decoder, a function (ids, n) -> the logits of the last n rows, and the vocabulary the
    ids are drawn from."""
    from specgen.core.drafters import TorchDraft
    from specgen.decoding import make_decoder
    from specgen.loading.load import load_pair
    from specgen.profiles import load_profile

    if role == "target":
        target = demo_target("gguf")
        decoder = make_decoder(target, exact=True)
        return decoder, decoder.logits, target.config.vocab_size
    prof = load_profile("qwen-coder-demo")
    rows = prof.speculation.draft_vocab or None
    draft = TorchDraft(load_pair(prof).draft, rows)
    # a draft reads its tokens and guesses the next: the logits of the last row only
    return draft.decoder, lambda ids, n: draft.logits(ids), rows or draft.vocab_size


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def layer_kernels(k: int, n: int) -> dict[str, object]:
    """Each kernel as a function of the input rows [M, k] (bf16), on streamed weights."""
    torch.manual_seed(0)
    w = torch.randn(n, k) * 0.02
    wb = w.bfloat16()
    bf16 = rotating(lambda: wb.clone(), wb.nbytes)
    out = {"bf16 F.linear": lambda x: F.linear(x, bf16())}
    if linear.library() is not None:
        for path in range(linear.bf16_path() + 1):
            out[f"bf16 C linear, path {path}"] = lambda x, p=path: linear.linear(x, bf16(), None, p)
    q8, s8 = quantize_int8(w)
    i8 = rotating(lambda: (q8.clone(), s8.clone()), q8.nbytes)
    out["int8-wo"] = lambda x: torch.cat([torch.ops.aten._weight_int8pack_mm(c, *i8())
                                          for c in x.split(quantize.ROWS_PER_CALL)])
    q4, sz4 = quantize_int4(w, 128)
    p4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q4, 8)
    i4 = rotating(lambda: (p4.clone(), sz4.clone()), p4.nbytes)

    def int4_wo(x):
        pw, sz = i4()
        return torch.cat([torch.ops.aten._weight_int4pack_mm_for_cpu(c, pw, 128, sz)
                          for c in x.split(quantize.ROWS_PER_CALL)])
    out["int4-wo"] = int4_wo
    dyn8 = rotating(lambda: QuantLinear(k, n, "int8-dyn", 0, q8, s8, None), q8.nbytes)
    out["int8-dyn"] = lambda x: dyn8()(x.float())
    packed, scales = int4.quantize(w)
    dyn4 = rotating(lambda: (packed.clone(), scales.clone()), packed.nbytes)
    for path in {int4.path_for(1), int4.AVX2}:
        out[f"int4-dyn, path {path}"] = lambda x, p=path: int4.linear(x.float(), *dyn4(), None, p)
    return out


def layers(reps: int) -> None:
    print(f"ms per call, minimum (median); {torch.get_num_threads()} threads; "
          f"int4 paths: 0 AVX2, 1 AVX512-VNNI; bf16 paths: 0 AVX2, 1 AVX512-BF16, 2 AMX")
    rows = []
    for label, (k, n) in SHAPES.items():
        for name, fn in layer_kernels(k, n).items():
            both = [interleaved({m: lambda m=m: fn(torch.randn(m, k).bfloat16())}, reps)[m]
                    for m in MS]
            rows.append([label, name, *(f"{lo:.2f} ({med:.1f})" for lo, med in both),
                         f"{both[3][0] / both[0][0]:.2f}"])
            print(" | ".join(rows[-1]), flush=True)
    print(table(["layer", "kernel", *(f"M={m}" for m in MS), "M=5 / M=1"], rows))
    torch.manual_seed(1)
    w, x = torch.randn(512, 1024) * 0.02, torch.randn(9, 1024)
    ref = x @ w.t()
    errors = {"int8": quantize.dequantize_int8(*quantize_int8(w)),
              "int4 g128": quantize.dequantize_int4(*quantize_int4(w, 128), 128),
              "int4-dyn": int4.dequantize(*int4.quantize(w))}
    for name, wq in errors.items():
        print(f"relative error {name} (random weights): {((x @ wq.t() - ref).norm() / ref.norm()):.4f}")


@torch.inference_mode()
def model(schemes: list[str], rounds: int) -> None:
    from specgen.decoding import make_decoder

    rows = []
    for scheme in schemes:
        target = demo_target(scheme)
        decoder = make_decoder(target, exact=True)
        vocab = target.config.vocab_size
        context = torch.randint(0, vocab, (64,))
        decoder.reset()
        decoder.logits(context, 1)

        def width(m: int):
            ids = torch.randint(0, vocab, (m,))
            return lambda: (decoder.logits(ids, m), decoder.crop(64))

        costs = interleaved({m: width(m) for m in MS}, rounds)
        base = costs[1][0]
        rows.append([scheme, type(decoder).__name__,
                     *(f"{costs[m][0]:.0f} ({costs[m][0] / base:.2f})" for m in MS)])
        print(" | ".join(rows[-1]), flush=True)
    print("ms per pass, minimum over rounds (relative to M=1)")
    print(table(["scheme", "decoder", *(f"M={m}" for m in MS)], rows))


@dataclass(frozen=True)
class LlamaBench:
    wall_ms: list[float]  # each repetition's prompt evaluation
    cpu_ms: float  # the process's CPU time per evaluation, its warm-up and model load included


def llama_bench(path: str, tokens: int, threads: int, reps: int = 2) -> LlamaBench | None:
    """llama-bench on the GGUF file: a prompt of `tokens`, `reps` repetitions after its
    warm-up run; None where llama.cpp's tools are not built."""
    from specgen.decoding import llamacpp_tools

    program = llamacpp_tools.tool("llama-bench")
    if program is None:
        print(llamacpp_tools.missing_line("llama-bench"))
        return None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([str(program), "-m", path, "-p", str(tokens), "-n", "0", "-t",
                           str(threads), "-r", str(reps), "-o", "json"], capture_output=True,
                          text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    samples = json.loads(done.stdout)[0]["samples_ns"]
    return LlamaBench([ns / 1e6 for ns in samples], 1e3 * cpu / (reps + 1))


@torch.inference_mode()
def prompt(tokens: int, rounds: int, threads: int) -> None:
    from specgen.decoding import make_decoder
    from specgen.kernels import gguf
    from specgen.loading.sources import gguf_file
    from specgen.profiles import load_profile

    path = str(gguf_file(load_profile("qwen-coder-demo").target))
    target = demo_target("gguf")
    decoder = make_decoder(target, exact=True)
    ids = torch.randint(0, target.config.vocab_size, (tokens,))
    names = {gguf.AVX2: "AVX2", gguf.VNNI: "VNNI", gguf.AMX: "AMX"}
    best = gguf.best_path
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for r in range(rounds + 1):  # the first round warms up
        for p in gguf.paths()[:: 1 if r % 2 else -1]:
            gguf.best_path = lambda p=p: p  # the decoder's layers call the best path
            try:
                decoder.reset()
                c0, t0 = time.process_time(), time.perf_counter()
                decoder.logits(ids, 1)
                w, c = time.perf_counter() - t0, time.process_time() - c0
            finally:
                gguf.best_path = best
            if r:
                wall.setdefault(names[p], []).append(1e3 * w)
                cpu.setdefault(names[p], []).append(1e3 * c)
        peer = llama_bench(path, tokens, threads)
        if peer is not None and r:
            wall.setdefault("llama.cpp (llama-bench)", []).extend(peer.wall_ms)
            cpu.setdefault("llama.cpp (llama-bench)", []).append(peer.cpu_ms)
    rows = [[name, f"{min(t):.0f} ({median(t):.0f})",
             f"{min(cpu[name]):.0f} ({median(cpu[name]):.0f})" if name in cpu else "-",
             f"{tokens / min(t) * 1e3:.1f}"] for name, t in wall.items()]
    print(f"prompt of {tokens} tokens, {threads} threads, {rounds} rounds: ms minimum (median)")
    print(table(["engine / GGUF path", "wall ms", "CPU ms", "tokens/s (best)"], rows))


def random_blocks(kind: str, n: int, k: int) -> object:
    """A GGUF weight [n, k] of `kind` from random bytes (every value the format holds), its
    fp16 scales finite."""
    import numpy as np

    from specgen.kernels import gguf

    fmt = gguf.FORMATS[kind]
    nb = k // fmt.block_weights
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (n, nb, fmt.block_bytes), dtype=np.uint8)
    for at in {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}.get(kind, (0,)):
        half = (rng.standard_normal((n, nb)) * 0.01).astype(np.float16)
        raw[:, :, at:at + 2] = half.view(np.uint8).reshape(n, nb, 2)
    return gguf.wrap(kind, raw.reshape(n, -1), n, k)


def path_label(path: int) -> str:
    from specgen.kernels import gguf

    if path == gguf.AMX:
        return f"AMX (VNNI below {gguf.amx_rows()} rows)"
    return {gguf.AVX2: "AVX2", gguf.VNNI: "VNNI"}[path]


def best_by_width(run: Callable[[torch.Tensor], int], widths: list[int], k: int, rounds: int,
                  clock: Callable[[], float]) -> dict[int, float]:
    """Seconds per call of `run(x)` (which returns how many calls it made) for x [m, k] of
    each width m: the minimum over `rounds` rounds after a warm-up round, the widths taken in
    the other order every other round."""
    best: dict[int, float] = {}
    for r in range(rounds + 1):
        for m in widths[:: 1 if r % 2 else -1]:
            x = torch.randn(m, k)
            t = clock()
            calls = run(x)
            if r:
                spent = (clock() - t) / calls
                best[m] = min(best.get(m, spent), spent)
    return best


def kquants(widths: list[int], rounds: int) -> None:
    from specgen.kernels import gguf

    torch.set_num_threads(1)
    rows = []
    for kind, k in (("Q4_K", 1536), ("Q4_K", 8960), ("Q5_K", 1536), ("Q6_K", 1536), ("Q6_K", 8960)):
        n = 512 * 1536 // k  # 768 K weights: the layer stays in L2
        w = random_blocks(kind, n, k)
        for p in gguf.paths():
            def twenty(x, p=p):
                for _ in range(20):
                    gguf.linear(x, w, None, p)
                return 20
            best = best_by_width(twenty, widths, k, rounds, time.thread_time)
            rows.append([f"{kind} K={k}", path_label(p),
                         *(f"{1e9 * best[m] / (n * k / 512):.1f}" for m in widths)])
            print(" | ".join(rows[-1]), flush=True)
    print(f"ns per 512 weights and pass, 1 thread, weights hot in L2, minimum over {rounds} rounds")
    print(table(["format", "path", *(f"M={m}" for m in widths)], rows))


# (format, out, in) of the demo pair's GGUF layers: the target's MLP, down and output layer,
# the draft's MLP (Q5_0), its v and output layer (Q8_0) and its down
STREAM_SHAPES = (("Q4_K", 8960, 1536), ("Q6_K", 1536, 8960), ("Q6_K", 151936, 1536),
                 ("Q5_0", 4864, 896), ("Q8_0", 4864, 896), ("Q4_K", 896, 4864))


def stream(widths: list[int], rounds: int) -> None:
    from specgen.kernels import gguf

    rows = []
    for kind, n, k in STREAM_SHAPES:
        base = random_blocks(kind, n, k)
        nbytes = base.data.numel()
        copies = [gguf.GGUFWeight(base.data.clone(), kind, n, k)
                  for _ in range(max(2, STREAM_BYTES // nbytes))]
        for p in gguf.paths():
            def each_copy(x, p=p):
                for w in copies:
                    gguf.linear(x, w, None, p)
                return len(copies)
            best = best_by_width(each_copy, widths, k, rounds, time.perf_counter)
            rows.append([f"{kind} {n}x{k}", path_label(p),
                         *(f"{nbytes / best[m] / 1e9:.1f}" for m in widths)])
            print(" | ".join(rows[-1]), flush=True)
    print(f"GB/s of weights read, {torch.get_num_threads()} threads, best of {rounds} rounds")
    print(table(["layer", "path", *(f"M={m}" for m in widths)], rows))


@dataclass(frozen=True)
class PieceTimes:
    wall: dict[str, float]  # seconds by label
    cpu: dict[str, float]  # the calling thread's CPU seconds by label


class PieceClock:
    """Wall and calling-thread CPU seconds spent inside wrapped functions, by label, since
    the last `take()`."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def wrap(self, fn: Callable, label: Callable[..., str]) -> Callable:
        def timed(*args, **kwargs):
            t, c = time.perf_counter(), time.thread_time()
            out = fn(*args, **kwargs)
            name = label(*args, **kwargs)
            self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - t
            self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - c
            return out
        return timed

    def take(self) -> PieceTimes:
        out = PieceTimes(self.wall, self.cpu)
        self.wall, self.cpu = {}, {}
        return out


@torch.inference_mode()
def pieces(widths: list[int], rounds: int, role: str = "target") -> None:
    from specgen.kernels import gguf, rows

    decoder, logits, vocab = demo_passes(role)
    decoder.reset()
    logits(torch.randint(0, vocab, (64,)), 1)
    clock = PieceClock()
    saved = gguf._blocks, gguf.Joined.__call__, rows.rope_attend, rows.rms_norm
    # a layer called alone, and the layers of one input called as one (gguf.Joined)
    gguf._blocks = clock.wrap(gguf._blocks, lambda x, w, *a, **k: f"{w.kind} {w.n}x{w.k}")
    gguf.Joined.__call__ = clock.wrap(gguf.Joined.__call__, lambda joined, x: " + ".join(
        f"{layer.weight.kind} {layer.out_features}x{layer.in_features}" for layer in joined.layers))
    rows.rope_attend = clock.wrap(rows.rope_attend, lambda *a, **k: "attention (rows.c)")
    rows.rms_norm = clock.wrap(rows.rms_norm, lambda *a, **k: "RMSNorm (rows.c)")
    wall: dict[int, dict[str, list[float]]] = {m: {} for m in widths}
    cpu: dict[int, dict[str, list[float]]] = {m: {} for m in widths}
    # The pieces are timed op by op (a GGUF layer in one call hides them); the pass is also
    # timed as generation runs it, a layer a call where the model has them.
    one_call, decoder.one_call = decoder.one_call, None
    try:
        for r in range(rounds + 1):  # the first round warms up
            for m in widths[:: 1 if r % 2 else -1]:
                ids = torch.randint(0, vocab, (m,))
                for whole in (False, True) if one_call else (False,):
                    decoder.one_call = one_call if whole else None
                    clock.take()
                    t, c = time.perf_counter(), time.thread_time()
                    logits(ids, m)
                    total, total_cpu = time.perf_counter() - t, time.thread_time() - c
                    decoder.crop(64)
                    got = clock.take()
                    if whole:
                        w, cp = {"the pass, a layer a call": total}, {"the pass, a layer a call": total_cpu}
                    else:
                        w, cp = got.wall, got.cpu
                        w["everything else"] = total - sum(w.values())
                        cp["everything else"] = total_cpu - sum(cp.values())
                        w["the pass"], cp["the pass"] = total, total_cpu
                    for name in w if r else ():
                        wall[m].setdefault(name, []).append(1e3 * w[name])
                        cpu[m].setdefault(name, []).append(1e3 * cp[name])
    finally:
        gguf._blocks, gguf.Joined.__call__, rows.rope_attend, rows.rms_norm = saved
        decoder.one_call = one_call
    header, rows_out = pieces_table(wall, cpu, widths)
    print(f"the demo {role}: ms per pass, wall / calling thread's CPU, minimum over {rounds} "
          f"rounds; {torch.get_num_threads()} threads")
    print(table(header, rows_out))


def pieces_table(wall: dict[int, dict[str, list[float]]], cpu: dict[int, dict[str, list[float]]],
                 widths: list[int]) -> tuple[list[str], list[list[str]]]:
    """`pieces`' table from each width's times per piece (ms, one per round): the minimum wall
    and CPU time of each, and with two widths or more what the widest adds to the narrowest."""
    lo, hi = widths[0], widths[-1]
    names = sorted(wall[lo], key=lambda n: (n.startswith("the pass"), n == "everything else", n))
    rows = [[n, *(f"{min(wall[m][n]):.1f} / {min(cpu[m][n]):.1f}" for m in widths)] for n in names]
    header = ["piece", *(f"M={m}" for m in widths)]
    if hi != lo:
        extra = {n: min(wall[hi][n]) - min(wall[lo][n]) for n in names}
        extra_cpu = {n: min(cpu[hi][n]) - min(cpu[lo][n]) for n in names}
        for row, n in zip(rows, names):
            row += [f"{extra[n]:+.1f} / {extra_cpu[n]:+.1f}",
                    f"{100 * extra_cpu[n] / extra_cpu['the pass']:.0f}%"]
        header += [f"M={hi} - M={lo}", "share of the extra CPU time"]
    return header, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["layers", "model", "prompt", "pieces", "kquants", "stream"])
    ap.add_argument("--widths", nargs="+", type=int,
                    help="pieces: 1 5; kquants: 1 2 3 5 8 9 16 17; stream: 1 2 3 4 5")
    ap.add_argument("--schemes", nargs="+", default=["gguf", "none", "int8-dyn", "int4-dyn"])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--model", choices=["target", "draft"], default="target",
                    help="pieces: the demo target or its draft")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.what == "layers":
        layers(args.reps)
    elif args.what == "prompt":
        prompt(args.tokens, args.rounds, args.threads)
    elif args.what == "pieces":
        pieces(args.widths or [1, 5], args.rounds, args.model)
    elif args.what == "kquants":
        kquants(args.widths or [1, 2, 3, 5, 8, 9, 16, 17], args.rounds)
    elif args.what == "stream":
        stream(args.widths or [1, 2, 3, 4, 5], args.rounds)
    else:
        model(args.schemes, args.rounds)


if __name__ == "__main__":
    main()
