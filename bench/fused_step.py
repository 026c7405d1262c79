"""FusedDecoder beside CudaDecoder on one model, side by side in one run: milliseconds a
pass per width (graph replay, CUDA events), CUDA kernels per one-token pass (eager, profiler)
and whether each row of a verify pass equals the one-token pass at its position; then a token
tree's verify pass of 16 rows (a chain of 5 drafts and two branches at each depth, as the
planner builds one) beside a chain's of 16: milliseconds, and whether each of its rows equals
the one-token pass along its branch.

    python bench/fused_step.py                         # a random model of Qwen2.5-1.5B's shape, bf16
    python bench/fused_step.py --model PATH            # a local Llama or Qwen2 model
    TRITON_INTERPRET=1 python bench/fused_step.py --tiny   # a smoke run on the CPU (no figures)
"""

from __future__ import annotations

import argparse

import torch

from specgen.decoding.cuda import CudaDecoder
from specgen.decoding.fused import FusedDecoder

QWEN_1_5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                 max_position_embeddings=32768)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=64, max_position_embeddings=512)


def build(args) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else getattr(torch, args.dtype)
    if args.model:
        return AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    torch.manual_seed(0)
    config = Qwen2Config(**(TINY if args.tiny else QWEN_1_5B), tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()


def kernels_per_pass(decoder, ids: torch.Tensor) -> int | None:
    """CUDA kernels one eager one-token pass launches (None without CUDA)."""
    if ids.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    decoder.logits(ids[:1])  # warm (Triton compiles on first use)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decoder.logits(ids[1:2])
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def median_ms(decoder, run, repeats: int) -> float | None:
    """Median milliseconds (CUDA events) of run(), a pass at the decoder's position, rolled
    back after each; None without CUDA."""
    if decoder.device.type != "cuda":
        return None
    start = decoder.length
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
        decoder.crop(start)
    return sorted(times)[len(times) // 2]


def ms_per_pass(decoder, ids: torch.Tensor, width: int, repeats: int) -> float | None:
    """Median milliseconds of a pass of `width` tokens at the same position."""
    return median_ms(decoder, lambda: decoder.logits(ids[:width], width), repeats)


# A chain of 5 drafts (nodes 1..5), then two branches at each depth, deepest first (core/tree.py)
TREE = (-1, 0, 1, 2, 3, 4, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0)


def tree_ms(decoder, ids: torch.Tensor, repeats: int) -> float | None:
    """Median milliseconds of TREE's verify pass at the same position."""
    return median_ms(decoder, lambda: decoder.tree_logits(ids[:len(TREE)], TREE), repeats)


def tree_rows_alone(decoder, prompt: torch.Tensor, ids: torch.Tensor) -> bool:
    """Whether each row of TREE's pass equals the one-token pass along its branch."""
    decoder.reset()
    decoder.logits(prompt[:-1])
    tokens = torch.cat([prompt[-1:], ids[1:len(TREE)]])
    tree = decoder.tree_logits(tokens, TREE)
    for node in range(len(TREE)):
        branch = [node]
        while TREE[branch[0]] > 0:
            branch.insert(0, TREE[branch[0]])
        decoder.reset()
        decoder.logits(prompt[:-1])
        for t in [0, *branch] if node else [0]:
            last = decoder.logits(tokens[t:t + 1])
        if not torch.equal(last[0], tree[node]):
            return False
    return True


def rows_alone(decoder, prompt: torch.Tensor, ids: torch.Tensor, width: int) -> bool:
    """Whether each row of a `width`-token pass equals the one-token pass at its position."""
    decoder.reset()
    decoder.logits(prompt)
    wide = decoder.logits(ids[:width], width)
    decoder.crop(len(prompt))
    one = torch.cat([decoder.logits(ids[t:t + 1]) for t in range(width)])
    return torch.equal(wide, one)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a local model directory (default: a random Qwen2.5-1.5B shape)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt", type=int, default=200, help="prompt tokens before the passes")
    ap.add_argument("--widths", default="1,2,5,9,17,33")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--tiny", action="store_true", help="a tiny fp32 model on the CPU (smoke run)")
    args = ap.parse_args()
    model = build(args)
    device = model.device
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab, (args.prompt,), generator=g).to(device)
    ids = torch.randint(0, vocab, (64,), generator=g).to(device)
    widths = [int(w) for w in args.widths.split(",")]
    print(f"model: {args.model or 'random ' + ('tiny' if args.tiny else 'Qwen2.5-1.5B shape')}, "
          f"{model.dtype}, {device}")
    print(f"{'decoder':<14}{'kernels/pass':>14}" + "".join(f"{'ms w=' + str(w):>10}" for w in widths)
          + f"{'rows alone (w=5)':>18}")
    for name, make in (("CudaDecoder", CudaDecoder), ("FusedDecoder", FusedDecoder)):
        eager = make(model, graphs=False)
        eager.reserve(args.prompt + 64)
        eager.logits(prompt)
        count = kernels_per_pass(eager, ids)
        decoder = make(model)
        decoder.reserve(args.prompt + 64)
        decoder.logits(prompt)
        times = [ms_per_pass(decoder, ids, w, args.repeats) for w in widths]
        same = rows_alone(decoder, prompt, ids, min(5, max(widths)))
        cells = "".join(f"{t:>10.3f}" if t is not None else f"{'-':>10}" for t in times)
        print(f"{name:<14}{count if count is not None else '-':>14}{cells}{str(same):>18}")
        decoder.reserve(args.prompt + 64, trees=True)
        decoder.reset()
        decoder.logits(prompt)
        chain, tree = ms_per_pass(decoder, ids, len(TREE), args.repeats), tree_ms(decoder, ids,
                                                                                args.repeats)
        alone = tree_rows_alone(decoder, prompt, ids)
        if chain is not None:
            print(f"{name:<14}tree of {len(TREE)} rows {tree:.3f} ms, a chain of {len(TREE)} "
                  f"{chain:.3f} ms ({tree / chain:.2f}x); rows alone along their branches: {alone}")
        else:
            print(f"{name:<14}tree of {len(TREE)} rows: rows alone along their branches: {alone}")


if __name__ == "__main__":
    main()
