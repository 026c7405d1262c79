"""The int4-dyn demo target on each path of specgen's int4 kernel (cpu_int4.c) this CPU runs,
side by side in one run: specgen's lean target forward over M new tokens after 64 of context,
and a prompt pass.

    SPECGEN_CACHE_DIR=... python bench/int4_paths.py --model <fp32 model folder> [--rounds 5]

Paths: AVX2; AVX512-VNNI (AVX2's bits, four blocks a load); and where the CPU has AVX512-VNNI,
what specgen runs (VNNI up to cpu_int4.WIDE_ROWS tokens, tile products beyond: a prompt; by AMX
where the CPU has it, else by VNNI registers). First checks
that AVX2 and VNNI give the same logits, bit for bit. Prints ms per pass, minimum (median) of
interleaved rounds, and each width's cost relative to one token. bench/NOTES.md, Round 16.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from specgen import cpu_int4, decoder, quantize
from specgen.models import cache_dir

MS = (1, 2, 3, 5, 9, 17)
PROMPT = 300  # tokens of a prompt pass
NAMES = {cpu_int4.AVX2: "AVX2", cpu_int4.VNNI: "AVX512-VNNI", cpu_int4.AMX: "VNNI, AMX for prompts",
         cpu_int4.VNNI_TILES: "VNNI, VNNI tiles for prompts"}
ROW_PATHS = (cpu_int4.AVX2, cpu_int4.VNNI)


def int4_target(doc: str, rounds: int, *extra: tuple[str, dict]
                ) -> tuple[argparse.Namespace, AutoModelForCausalLM]:
    """The command line (--model, --rounds, --threads, and `extra` options: (flag, keywords of
    add_argument)) and the model it names, quantized to int4-dyn (cached): what the int4 bench
    scripts measure."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for flag, keywords in extra:
        ap.add_argument(flag, **keywords)
    ap.add_argument("--model", required=True, help="a float32 Llama/Qwen2 model folder")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    quantize.apply(model, "int4-dyn", cache_dir() / "quantized", f"bench:{args.model}")
    return args, model


def main() -> None:
    args, model = int4_target(__doc__, rounds=5)
    lean = decoder.make_decoder(model, exact=True)
    ids = torch.randint(0, model.config.vocab_size, (64 + PROMPT,))
    paths = [p for p in ROW_PATHS if p in cpu_int4.paths()]
    if cpu_int4.path_for(PROMPT) not in ROW_PATHS:
        paths.append(cpu_int4.path_for(PROMPT))
    real, chosen = cpu_int4.linear, {"path": None}
    # A tile path is what specgen picks by width; forcing it would send one-token passes to it.
    cpu_int4.linear = lambda *a: real(*a, path=chosen["path"] if chosen["path"] in ROW_PATHS else None)

    def use(path: int) -> None:
        chosen["path"] = path

    def once(m: int) -> tuple[float, torch.Tensor]:
        start = 0 if m == PROMPT else 64
        t = time.perf_counter()
        logits = lean.logits(ids[start:start + m], m if m != PROMPT else 1)
        seconds = time.perf_counter() - t
        lean.crop(64)
        return 1e3 * seconds, logits

    with torch.inference_mode():
        lean.logits(ids[:64], 1)
        if cpu_int4.VNNI in paths:
            same = []
            for m in MS:
                use(cpu_int4.AVX2)
                a = once(m)[1]
                use(cpu_int4.VNNI)
                same.append(torch.equal(a, once(m)[1]))
            print(f"AVX2 and AVX512-VNNI logits equal, bit for bit, at M = {MS}: {same}")
        times = {(p, m): [] for p in paths for m in MS + (PROMPT,)}
        for _ in range(args.rounds):  # interleaved: the VM's drift hits every path alike
            for p in paths:
                use(p)
                for m in MS + (PROMPT,):
                    if m == PROMPT:
                        lean.crop(0)
                    times[p, m].append(once(m)[0])
                    if m == PROMPT:
                        lean.logits(ids[:64], 1)
    print(f"int4-dyn {args.model}: ms per pass, minimum (median) of {args.rounds} interleaved rounds; "
          f"ratios to M=1 from the minima; the last column a {PROMPT}-token prompt pass")
    print("| path | " + " | ".join(f"M={m}" for m in MS) + " | "
          + " | ".join(f"M={m} / M=1" for m in MS[1:]) + f" | prompt of {PROMPT} |")
    print("|---|" + "---|" * (2 * len(MS)))
    for p in paths:
        lo = [min(times[p, m]) for m in MS]
        cells = " | ".join(f"{min(times[p, m]):.0f} ({statistics.median(times[p, m]):.0f})" for m in MS)
        ratios = " | ".join(f"{t / lo[0]:.2f}" for t in lo[1:])
        prompt = times[p, PROMPT]
        print(f"| {NAMES[p]} | {cells} | {ratios} | {min(prompt):.0f} ({statistics.median(prompt):.0f}) |",
              flush=True)


if __name__ == "__main__":
    main()
