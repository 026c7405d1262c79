"""specgen's C attention (cpu_rows.c, `attention_rows`) against its source at another git
revision, side by side in one process: first that both give the same bits on a range of
shapes, then one layer's call, and the int4-dyn target's lean forward over a 300-token prompt
and over one new token after it.

    SPECGEN_CACHE_DIR=... python bench/attention_ab.py --model <fp32 model folder> [--rev HEAD~1]

REV must share this `attention_rows` and `rope_attend` signature. Prints medians of
interleaved calls and new over old. bench/NOTES.md, Round 19.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
from int4_ab import old_library  # bench/, beside this script
from int4_paths import int4_target

from specgen import cpu_rows, decoder

SHAPES = [  # heads, kv heads, head dim; rows, positions, window
    (h, kv, d, m, t, w) for h, kv, d in ((12, 2, 128), (4, 4, 16), (8, 2, 72), (2, 1, 256))
    for m, t, w in ((1, 1, 1), (1, 37, 37), (5, 64, 64), (300, 300, 300), (7, 90, 20))]
PROMPT = 300


def attend(lib, q, k, v, t: int, window: int) -> torch.Tensor:
    """attention_rows of q [m, heads, d] over k, v [kv_heads, t, d]."""
    m, heads, d = q.shape
    out, scratch = torch.empty_like(q), torch.empty(torch.get_num_threads(), t)
    lib.attention_rows(q.data_ptr(), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                       out.data_ptr(), m, heads, k.shape[0], t, d, window, d ** -0.5,
                       scratch.data_ptr(), torch.get_num_threads())
    return out


def interleaved(libs: dict, rounds: int, call) -> dict[str, float]:
    """Median ms of call() with each library, the order alternated round by round."""
    times = {name: [] for name in libs}
    for r in range(rounds):
        for name in list(libs)[:: 1 if r % 2 else -1]:
            cpu_rows._lib = libs[name]
            start = time.perf_counter()
            call(libs[name])
            times[name].append(1e3 * (time.perf_counter() - start))
    return {name: statistics.median(t) for name, t in times.items()}


def report(what: str, ms: dict[str, float]) -> None:
    print(f"{what}: {ms['old']:.3f} -> {ms['new']:.3f} ms ({ms['new'] / ms['old']:.2f})", flush=True)


def main() -> None:
    args, model = int4_target(__doc__, 6, ("--rev", {"default": "HEAD~1"}))
    new = cpu_rows.library()
    with tempfile.TemporaryDirectory() as folder:
        old = old_library(args.rev, Path(folder), "cpu_rows")
        for name in ("attention_rows", "rope_attend", "rms_norm"):
            getattr(old, name).argtypes = getattr(new, name).argtypes
        libs = {"old": old, "new": new}
        same = []
        for h, kv, d, m, t, w in SHAPES:
            q, k, v = torch.randn(m, h, d), torch.randn(kv, t, d) * 2, torch.randn(kv, t, d)
            same.append(torch.equal(attend(old, q, k, v, t, w), attend(new, q, k, v, t, w)))
        print(f"{args.rev} (old) against the working tree (new), {args.threads} threads; "
              f"the same bits on {sum(same)} of {len(same)} shapes", flush=True)
        q, k, v = torch.randn(PROMPT, 12, 128), torch.randn(2, PROMPT, 128), torch.randn(2, PROMPT, 128)
        report(f"one layer, {PROMPT} rows", interleaved(libs, 20 * args.rounds,
                                                        lambda lib: attend(lib, q, k, v, PROMPT, PROMPT)))
        q1 = q[:1].contiguous()
        report(f"one layer, one row over {PROMPT} positions",
               interleaved(libs, 200 * args.rounds, lambda lib: attend(lib, q1, k, v, PROMPT, PROMPT)))
        ids = torch.randint(0, model.config.vocab_size, (PROMPT + 1,))
        lean = decoder.make_decoder(model, exact=True)

        def prompt(lib) -> None:
            lean.reset()
            lean.logits(ids[:PROMPT], 1)

        def step(lib) -> None:
            lean.logits(ids[PROMPT:], 1)
            lean.crop(PROMPT)

        with torch.inference_mode():
            report(f"target, a {PROMPT}-token prompt pass", interleaved(libs, args.rounds, prompt))
            lean.logits(ids[:PROMPT], 1)
            report(f"target, one token after {PROMPT}", interleaved(libs, 10 * args.rounds, step))
        cpu_rows._lib = new


if __name__ == "__main__":
    main()
