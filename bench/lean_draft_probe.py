"""Where a draft pass goes: one-token draft forwards after a 64-token context, transformers'
forward (HFDecoder) against the lean one (LeanDecoder), with the int8-dyn layers scaled per
row with an anchor (as a verifier's) or by fbgemm itself (as a draft's now are), and the lean
forward with its int8-dyn projections called one by one or joined (q/k/v and gate/up in one
fbgemm call each, as it runs now).

    SPECGEN_CACHE_DIR=... python bench/lean_draft_probe.py [--profile qwen-coder-demo-int8]

Prints ms per draft pass (body and output layer), minimum and median of --reps, for each of
the five arrangements in turn, --rounds times (the machine drifts); the models are loaded as
the profile loads them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specgen.decoder import HFDecoder, LeanDecoder
from specgen.models import load_pair
from specgen.profiles import load_profile
from specgen.quantize import QuantLinear


def per_call_ms(decoder, head, ids: torch.Tensor, reps: int) -> tuple[float, float]:
    """One draft pass: a token through the body and the output layer, then rolled back."""
    times = []
    for i in range(reps + 3):  # three warm-up calls
        start = time.perf_counter()
        head(decoder.hidden(ids[i % len(ids):][:1]))
        if i >= 3:
            times.append(time.perf_counter() - start)
        decoder.crop(len(ids))
    return 1e3 * min(times), 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="qwen-coder-demo-int8")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    draft = load_pair(load_profile(args.profile)).draft
    layers = [m for m in draft.modules() if isinstance(m, QuantLinear)]
    ids = torch.randint(100, 5000, (64,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        decoders = {"transformers": HFDecoder(draft), "lean": LeanDecoder(draft)}
        for decoder in decoders.values():
            decoder.hidden(ids)
        joined = decoders["lean"].projections
        for _ in range(args.rounds):
            arrangements = [(True, "transformers"), (True, "lean"), (False, "transformers"),
                            (False, "lean"), (False, "lean, joined")]
            for anchored, name in arrangements:
                for layer in layers:
                    layer.batch_invariant = anchored
                for projections in joined:
                    for p in projections:
                        p.joined = name == "lean, joined"
                decoder = decoders[name.split(",")[0]]
                best, median = per_call_ms(decoder, draft.get_output_embeddings(), ids, args.reps)
                scaling = "anchor row" if anchored else "fbgemm's own"
                print(f"{name:>12} forward, {scaling:>12} scaling: {best:6.1f} ms min, "
                      f"{median:6.1f} ms median")


if __name__ == "__main__":
    main()
