"""Where a plain decoding step of an int4-dyn target goes: transformers' `generate` (the bench's
baseline) and specgen's lean forward (its plain loop), with the time inside specgen's int4
kernel calls, its C norms and its C attention counted apart from the rest (PyTorch's ops,
Python).

    SPECGEN_CACHE_DIR=... python bench/int4_step.py --model <fp32 model folder> [--rounds 3]

A step of `generate` is the difference between generating 1 + N and 1 token, over N; a lean
step is one `logits` call of one token. 64 random tokens of context. bench/NOTES.md, Round 17.
"""

from __future__ import annotations

import time

import torch
from int4_paths import int4_target  # bench/, beside this script

from specgen import cpu_rows, decoder, quantize

STEPS = 48


class Clock:
    """Wraps module functions by name and adds up each one's calls and time: specgen's int4
    kernel (cpu_int4.linear, as quantize.py calls it) and the C norms and attention
    (cpu_rows.rms_norm; cpu_rows.rope_attend, or cpu_rows.attention through row_attention)."""

    def __init__(self, targets: dict[str, tuple[object, str]]) -> None:
        self.seconds = dict.fromkeys(targets, 0.0)
        self.calls = dict.fromkeys(targets, 0)
        for name, (module, attr) in targets.items():
            setattr(module, attr, self.wrap(name, getattr(module, attr)))

    def wrap(self, name: str, real):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            y = real(*args, **kwargs)
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1
            return y
        return timed

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self.calls = dict.fromkeys(self.calls, 0)


def generate_step(model, ids: torch.Tensor, clock: Clock) -> tuple[float, dict, dict]:
    """ms a step, and each clocked function's ms and calls a step."""
    measured = []
    for new in (1, 1 + STEPS):
        clock.reset()
        start = time.perf_counter()
        model.generate(ids[None], max_new_tokens=new, min_new_tokens=new, do_sample=False)
        measured.append((time.perf_counter() - start, dict(clock.seconds), dict(clock.calls)))
    (t1, s1, c1), (tn, sn, cn) = measured
    return (1e3 * (tn - t1) / STEPS, {k: 1e3 * (sn[k] - s1[k]) / STEPS for k in sn},
            {k: (cn[k] - c1[k]) / STEPS for k in cn})


def lean_step(model, ids: torch.Tensor, clock: Clock) -> tuple[float, dict, dict]:
    lean = decoder.make_decoder(model, exact=True)
    token = lean.logits(ids, 1).argmax(-1)
    clock.reset()
    start = time.perf_counter()
    for _ in range(STEPS):
        token = lean.logits(token, 1).argmax(-1)
    seconds = time.perf_counter() - start
    return (1e3 * seconds / STEPS, {k: 1e3 * v / STEPS for k, v in clock.seconds.items()},
            {k: v / STEPS for k, v in clock.calls.items()})


def main() -> None:
    args, model = int4_target(__doc__, rounds=3)
    clock = Clock({"int4 kernel": (quantize.cpu_int4, "linear"), "norms": (cpu_rows, "rms_norm"),
                   "attention": (cpu_rows, "rope_attend"),  # the lean forward's
                   "row attention": (cpu_rows, "attention")})  # transformers' forward's
    ids = torch.randint(0, model.config.vocab_size, (64,))
    print(f"int4-dyn {args.model}, {args.threads} threads, {STEPS} steps after 64 tokens")
    with torch.inference_mode():
        for r in range(args.rounds):
            for name, step in (("generate", generate_step), ("lean", lean_step)):
                ms, parts, calls = step(model, ids, clock)
                timed = ", ".join(f"{k} {v:.1f} ({calls[k]:.0f} calls)" for k, v in parts.items())
                print(f"round {r + 1} {name:8s}: {ms:5.1f} ms a step: {timed}, "
                      f"the rest {ms - sum(parts.values()):.1f}")


if __name__ == "__main__":
    main()
