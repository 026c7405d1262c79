"""Probe: prompt-lookup drafting vs plain decoding on input-grounded prompts (greedy).

Prints tokens/s of plain `target.generate` and of SpeculativeGenerator with a
PromptLookupDrafter (adaptive K), with acceptance figures and whether the outputs agree.

    flock /tmp/specgen-heavy.lock env PYTHONPATH=src python bench/lookup_probe.py \
        --model /work/demo-models/bf16-1.5b --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specgen.drafters import PromptLookupDrafter
from specgen.engine import SpeculativeGenerator

CODE = '''def load_records(path, delimiter, skip_header, columns, defaults):
    records = []
    with open(path) as handle:
        lines = handle.read().splitlines()
    if skip_header:
        lines = lines[1:]
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        fields = line.split(delimiter)
        if len(fields) < len(columns):
            fields = fields + [None] * (len(columns) - len(fields))
        record = {}
        for name, value in zip(columns, fields):
            if value is None or value == "":
                value = defaults.get(name)
            record[name] = value
        record["line_number"] = number
        records.append(record)
    return records


def summarise(records, key, value_key):
    totals = {}
    counts = {}
    for record in records:
        group = record[key]
        totals[group] = totals.get(group, 0.0) + float(record[value_key])
        counts[group] = counts.get(group, 0) + 1
    return {group: totals[group] / counts[group] for group in totals}
'''

PASSAGE = (
    "The city council met on Tuesday evening to discuss the proposal for a new public library "
    "in the northern district. Several residents spoke in favour of the project, noting that the "
    "nearest library is more than five kilometres away and that the buses that serve the area run "
    "only once an hour. Others raised concerns about the cost of the building, which the council "
    "estimates at twelve million euros, and about the loss of the small park that currently "
    "occupies the site. After two hours of debate, the council agreed to commission a study of "
    "alternative sites and to report back to residents before the end of the year."
)

PROMPTS = {
    "code-edit": f"Rewrite this code with type hints. Output only the code.\n\n```python\n{CODE}```",
    "prose-edit": "Rewrite this paragraph in British English, changing as little as possible:\n\n"
    + PASSAGE,
}


class CountingLookup(PromptLookupDrafter):
    """Records the K the policy asked for and how many tokens lookup found."""

    def reset(self) -> None:
        super().reset()
        self.asked: list[int] = []
        self.found: list[int] = []

    def propose(self, tokens, k, params, generator, guesser=None, stop_below=0.0):
        ids, q = super().propose(tokens, k, params, generator, guesser, stop_below)
        self.asked.append(k)
        self.found.append(ids.shape[0])
        return ids, q


def chat_ids(tokenizer, text: str) -> torch.Tensor:
    messages = [{"role": "user", "content": text}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    return ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="/work/demo-models/bf16-1.5b")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("-k", type=int, default=8)
    parser.add_argument("--prompts", nargs="*", default=list(PROMPTS))
    parser.add_argument("--fixed-k", action="store_true", help="adaptive K off")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain baseline")
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    target = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).eval()
    n = args.max_new_tokens
    with torch.inference_mode():
        target.generate(chat_ids(tokenizer, "Hi")[:, :8], do_sample=False, max_new_tokens=4)  # warm up

    print(f"torch threads {torch.get_num_threads()}, greedy, bf16, {n} new tokens, K max {args.k}")
    for name in args.prompts:
        ids = chat_ids(tokenizer, PROMPTS[name])
        # Plain decoding; EOS ignored on both sides so each produces exactly n tokens.
        plain, plain_s = [], float("nan")
        if not args.no_plain:
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = target.generate(ids, do_sample=False, max_new_tokens=n, min_new_tokens=n)
            plain_s = time.perf_counter() - t0
            plain = out[0, ids.shape[1] :].tolist()

        drafter = CountingLookup()
        gen = SpeculativeGenerator(target, drafter, args.k, adaptive=not args.fixed_k)
        t0 = time.perf_counter()
        result = gen.generate(ids, max_new_tokens=n, eos_token_ids=[])
        spec_s = time.perf_counter() - t0
        s = result.stats
        same = sum(a == b for a, b in zip(plain, result.token_ids))
        prefix = next((i for i, (a, b) in enumerate(zip(plain, result.token_ids)) if a != b), n)
        print(
            f"{name}: prompt {ids.shape[1]} tokens | plain {n / plain_s:.2f} tok/s "
            f"({plain_s:.1f} s) | lookup {len(result.token_ids) / spec_s:.2f} tok/s "
            f"({spec_s:.1f} s) | speedup {plain_s / spec_s * len(result.token_ids) / n:.2f}x "
            f"| adaptive {gen.adaptive}"
        )
        print(
            f"  target passes {s.target_passes}, tau {s.tau:.2f}, proposed {s.proposed}, "
            f"accepted {s.accepted} ({s.acceptance_rate:.2f}), draft {s.draft_seconds:.2f} s, "
            f"verify {s.verify_seconds:.2f} s, prefill {s.prefill_seconds:.2f} s"
        )
        print(f"  K asked by the policy: {sorted(Counter(drafter.asked).items())}")
        no_match = sum(a > 0 and f == 0 for a, f in zip(drafter.asked, drafter.found))
        print(f"  K proposed: {sorted(Counter(s.k_per_step).items())} ({no_match} without a match)")
        print(f"  outputs agree on {same}/{n} tokens (identical prefix {prefix}; bf16 caveat)")
        print("  text:", repr(tokenizer.decode(result.token_ids)[:300]))


if __name__ == "__main__":
    main()
