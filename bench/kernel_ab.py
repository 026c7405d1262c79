"""One of specgen's C kernels against its source at another git revision, side by side in one
process: first whether both give the same bits, then interleaved timings of layer calls and
of the demo target's forward (a prompt pass, one token, a verify pass of 5).

    python bench/kernel_ab.py int4 --rev HEAD~1 [--scheme int4-dyn] [--rounds 6]
    python bench/kernel_ab.py rows --rev HEAD~1 [--scheme int4-dyn]
    python bench/kernel_ab.py linear --rev HEAD~1 [--scheme none] [--dtype float32]
    python bench/kernel_ab.py linear --rev registers16 --dtype float32
    python bench/kernel_ab.py int8 --rev fbgemm [--scheme int8-dyn]

The other revision's source (with the header beside it) is compiled with today's flags and
swapped in through kernels.build.swapped, so REV must share today's function signatures and
scratch sizes. `--rev fbgemm` (int8 only) is PyTorch's fbgemm dynamic linear, which int8-dyn
falls back to where its kernel cannot be built, instead of another revision; `--rev
registers16` (linear only) is today's library with the AVX2 path's 16-register tiles (fp32,
and bf16 where the CPU has nothing faster) against its 32-register ones. Prints medians
of interleaved calls and new over old.
"""

from __future__ import annotations

import argparse
import importlib
import tempfile
from pathlib import Path

import torch

from harness import demo_target, interleaved, library_at, rotating  # bench/, beside this script
from specgen.kernels import build

PROMPT = 300
REGISTERS16 = "registers16"  # --rev: linear.c's AVX2 tiles in 16 registers, today's source
DTYPE = torch.bfloat16  # the linear kernel's layers (--dtype)


def using(stem: str, lib, mod):
    """Where calls take `lib`: swapped in for the kernel's library, or (REGISTERS16) today's
    linear library with its AVX2 tiles held to 16 registers."""
    if lib == REGISTERS16:
        return mod.avx2_registers(16)
    return build.swapped(stem, lib, mod.declare)


def same_bits(stem: str, old, new) -> str:
    """How many of a few calls give the same bits with both libraries."""
    mod = importlib.import_module(f"specgen.kernels.{stem}")
    torch.manual_seed(0)
    results = []
    for m, k, n in ((1, 1536, 256), (5, 1536, 512), (17, 8960, 256), (300, 1536, 256)):
        x = torch.randn(m, k)
        if stem == "int4":
            packed, scales = mod.quantize(torch.randn(n, k) * 0.02)
            call = lambda: mod.linear(x, packed, scales, None)  # noqa: E731
        elif stem == "int8":
            layer = int8_layer(torch.randn(n, k) * 0.02)
            call = lambda: layer.dyn(x)  # noqa: E731
        elif stem == "linear":
            w = (torch.randn(n, k) * 0.02).to(DTYPE)
            call = lambda: mod.linear(x.to(DTYPE), w, None)  # noqa: E731
        else:
            weight = torch.rand(k) + 0.5
            call = lambda: mod.rms_norm(x, weight, 1e-6)  # noqa: E731
        outs = []
        for lib in (old, new):
            with using(stem, lib, mod):
                outs.append(call())
        results.append(torch.equal(*outs))
    return f"the same bits on {sum(results)} of {len(results)} calls"


def int8_layer(w: torch.Tensor):
    """A target's int8-dyn layer of w that computes by either kernel: packed for fbgemm as well."""
    from specgen.kernels import quantize

    layer = quantize.QuantLinear.from_linear(linear_of(w), "int8-dyn")
    layer.packed = quantize.prepack_int8(layer.weight, layer.scales)
    return layer


def linear_of(w: torch.Tensor) -> torch.nn.Linear:
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight.data = w
    return linear


def layer_calls(stem: str, libs: dict, rounds: int) -> None:
    if stem not in ("int4", "linear", "int8"):
        return
    mod = importlib.import_module(f"specgen.kernels.{stem}")
    for k, n in ((1536, 8960), (8960, 1536)):
        w = torch.randn(n, k) * 0.02
        if stem == "int4":
            packed, scales = mod.quantize(w)
            weights = rotating(lambda: (packed.clone(), scales.clone()), packed.nbytes)
            call = lambda x: mod.linear(x, *weights(), None)  # noqa: E731
        elif stem == "int8":
            weights = rotating(lambda: int8_layer(w), n * k)
            call = lambda x: weights().dyn(x)  # noqa: E731
        else:
            wb = w.to(DTYPE)
            weights = rotating(lambda: wb.clone(), wb.nbytes)
            call = lambda x: mod.linear(x.to(DTYPE), weights(), None)  # noqa: E731
        for m in (1, 5):
            x = torch.randn(m, k)
            variants = {}
            for name, lib in libs.items():
                def run(lib=lib):
                    with using(stem, lib, mod):
                        call(x)
                variants[name] = run
            report(f"{k}->{n}, {m} row(s)", interleaved(variants, 20 * rounds))


@torch.inference_mode()
def model_passes(stem: str, libs: dict, target, rounds: int) -> None:
    from specgen.decoding import make_decoder

    mod = importlib.import_module(f"specgen.kernels.{stem}")
    if stem == "int8":  # every layer computable by fbgemm too
        from specgen.kernels.quantize import QuantLinear, prepack_int8

        for layer in target.modules():
            if isinstance(layer, QuantLinear) and layer.kind == "int8-dyn":
                layer.packed = prepack_int8(layer.weight, layer.scales)
    vocab = target.config.vocab_size
    ids = torch.randint(0, vocab, (PROMPT + 5,))
    decoder = make_decoder(target, exact=True)

    def with_lib(lib, fn):
        def run():
            with using(stem, lib, mod):
                fn()
        return run

    def prompt():
        decoder.reset()
        decoder.logits(ids[:PROMPT], 1)

    def step(m: int):
        return lambda: (decoder.logits(ids[PROMPT:PROMPT + m], m), decoder.crop(PROMPT))

    report(f"target, a {PROMPT}-token prompt pass",
           interleaved({n: with_lib(lib, prompt) for n, lib in libs.items()}, rounds))
    for m in (1, 5):
        report(f"target, {m} token(s) after {PROMPT}",
               interleaved({n: with_lib(lib, step(m)) for n, lib in libs.items()}, 10 * rounds))


def report(what: str, ms: dict[str, tuple[float, float]]) -> None:
    old, new = ms["old"][1], ms["new"][1]
    print(f"{what}: {old:.3f} -> {new:.3f} ms ({new / old:.2f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel", choices=["int4", "linear", "rows", "int8"])
    ap.add_argument("--rev", default="HEAD~1")
    ap.add_argument("--scheme", default=None, help="the target's quantization (default: the kernel's)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                    help="the linear kernel's layers and the demo target's dtype (linear only)")
    args = ap.parse_args()
    global DTYPE
    DTYPE = getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    mod = importlib.import_module(f"specgen.kernels.{args.kernel}")
    new = mod.library()
    if new is None:
        raise SystemExit(f"kernel {args.kernel} cannot be built on this machine")
    with tempfile.TemporaryDirectory() as folder:
        if args.rev == "fbgemm" and args.kernel == "int8":
            old = None  # build.swapped: PyTorch's ops
        elif args.rev == REGISTERS16 and args.kernel == "linear":
            old = REGISTERS16
        else:
            old = library_at(args.rev, args.kernel, Path(folder))
            mod.declare(old)
        libs = {"old": old, "new": new}
        print(f"{args.kernel}.c at {args.rev} (old) against the working tree (new), "
              f"{args.threads} threads; {same_bits(args.kernel, old, new)}; medians", flush=True)
        layer_calls(args.kernel, libs, args.rounds)
        scheme = args.scheme or {"int4": "int4-dyn", "rows": "int4-dyn", "linear": "none",
                                 "int8": "int8-dyn"}[args.kernel]
        dtype = args.dtype if args.kernel == "linear" else "auto"
        model_passes(args.kernel, libs, demo_target(scheme, dtype), args.rounds)


if __name__ == "__main__":
    main()
