"""What reading a prompt costs a draft model: the profile's draft in transformers against its
GGUF file in llama.cpp, over prompts of 32, 100, 200 and 400 random tokens.

    SPECGEN_CACHE_DIR=... python bench/draft_prompt_read.py [--profile qwen-coder-demo-int8]

A draft reads the prompt once, when it is first asked to draft, in one batched pass. Prints
seconds for the first read and the median of three more (the cache reset in between), per
runtime and length. Needs llama-cpp-python and a profile whose draft is a GGUF file.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers.utils import logging as hf_logging

from specgen.drafters import TorchDraft
from specgen.models import load_llama_draft, locate_gguf
from specgen.profiles import load_profile, with_overrides
from specgen.session import open_session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="qwen-coder-demo-int8")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    prof = with_overrides(load_profile(args.profile), draft_runtime="transformers")
    session = open_session(prof)
    base = prof.path.parent if prof.path else None
    drafts = {"transformers": TorchDraft(session.pair.draft),
              "llama.cpp": load_llama_draft(locate_gguf(prof.draft, "draft", None, base))}
    g = torch.Generator().manual_seed(0)
    for n in (32, 100, 200, 400):
        ids = torch.randint(100, 30000, (n,), generator=g)
        for name, lm in drafts.items():
            times = []
            for _ in range(4):
                lm.reset()
                start = time.perf_counter()
                lm.logits(ids)
                times.append(time.perf_counter() - start)
            rest = statistics.median(times[1:])
            print(f"{n:4d} tokens  {name:13s} first {times[0]:.3f} s, then {rest:.3f} s "
                  f"({1e3 * rest / n:.1f} ms a token)", flush=True)


if __name__ == "__main__":
    main()
