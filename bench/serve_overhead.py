"""What the server costs per token: the same prompts answered by `specgen run`'s code path
(app.answer, in this process) and through `specgen serve` (SSE over loopback HTTP, read by a
plain streaming client in this process), interleaved by specgen's bench harness, on one
loaded pair.

Both contestants start each answer from an empty cache (generator.reset()), greedy, with the
profile's settings. Time to first token: from the call (or the request) to the first token
(or the first content chunk). Tokens/s: new tokens over the whole call (or from the request
to `data: [DONE]`).

    flock /tmp/specgen-heavy.lock python bench/serve_overhead.py --profile qwen-coder-demo \
        --repeats 3 --out bench/results/serve-overhead.json
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch

from specgen.app.answer import answer
from specgen.app.session import open_session
from specgen.bench.harness import interleave, median
from specgen.bench.prompts import PROMPTS
from specgen.profiles import load_profile, with_overrides
from specgen.serve.server import Server


def via_run(session, prompt: str) -> tuple[float, float, int]:
    start = time.perf_counter()
    first: list[float] = []

    def on_text(piece: str, source: str) -> None:
        if not first:
            first.append(time.perf_counter())

    result = answer(session, prompt, on_text=on_text)
    total = time.perf_counter() - start
    return first[0] - start, total, result.stats.new_tokens


def via_server(client: httpx.Client, prompt: str, max_tokens: int) -> tuple[float, float, int, dict]:
    body = {"model": client.profile, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first = None
    tokens = 0
    ext: dict = {}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content") and first is None:
                first = time.perf_counter()
            if chunk["choices"] and chunk["choices"][0]["finish_reason"]:
                ext = chunk["specgen"]
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    total = time.perf_counter() - start
    return first - start, total, tokens, ext


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="qwen-coder-demo")
    parser.add_argument("--prompts", type=int, default=4, help="the first N built-in prompts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    profile = with_overrides(load_profile(args.profile), max_new_tokens=args.max_new_tokens)
    session = open_session(profile)
    server = Server(session, "127.0.0.1", 0, stats_db=Path(tempfile.mkdtemp()) / "history.sqlite3")
    server.bind()
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    client = httpx.Client(base_url=server.url, timeout=600)
    client.profile = profile.name

    prompts = [p for _, p in PROMPTS[: args.prompts]]

    def warm_up(who: str) -> None:  # first-call costs (kernels, allocator, routes) out of the figures
        if who == "run":
            via_run(session, "warm up")
        else:
            via_server(client, "warm up", 8)

    def call(who: str, i: int, rep: int) -> dict:
        session.generator.reset()  # the server is idle here: both start from no cache
        ext = {}
        if who == "run":
            ttft, total, n = via_run(session, prompts[i])
        else:
            ttft, total, n, ext = via_server(client, prompts[i], args.max_new_tokens)
        row = {"contestant": who, "prompt": i, "repeat": rep, "ttft_s": ttft,
               "total_s": total, "new_tokens": n, "tokens_per_second": n / total,
               "decode_tokens_per_second": (n - 1) / (total - ttft)}
        if ext:  # the server's own clock: what HTTP adds around the generation
            row["server_generation_s"] = ext["generation_seconds"]
            row["server_queue_s"] = ext["queue_seconds"]
            row["http_s"] = total - ext["generation_seconds"] - ext["queue_seconds"]
        return row

    def show(trial) -> None:
        row = trial.value
        print(f"{row['contestant']:5s} prompt {row['prompt']} repeat {row['repeat']}: ttft "
              f"{row['ttft_s'] * 1000:7.1f} ms  {row['new_tokens']} tokens  "
              f"{row['tokens_per_second']:6.2f} tok/s", flush=True)

    trials = interleave(["run", "serve"], len(prompts), call, repeats=args.repeats,
                        warm_up=warm_up, on_trial=show)
    rows = [t.value for t in trials]

    summary = {}
    for who in ("run", "serve"):
        mine = [r for r in rows if r["contestant"] == who]
        summary[who] = {"ttft_ms_median": 1000 * median(r["ttft_s"] for r in mine),
                        "tokens_per_second_median": median(r["tokens_per_second"] for r in mine),
                        "decode_tokens_per_second_median": median(
                            r["decode_tokens_per_second"] for r in mine),
                        "seconds_total": sum(r["total_s"] for r in mine),
                        "tokens_total": sum(r["new_tokens"] for r in mine)}
    # Per token: the server's extra seconds over all its tokens, against run's time per token.
    per_token = {who: s["seconds_total"] / s["tokens_total"] for who, s in summary.items()}
    summary["overhead_per_token"] = per_token["serve"] / per_token["run"] - 1
    # The same, as the median over (prompt, repeat) pairs run back to back.
    pairs = [(r, s) for r in rows if r["contestant"] == "run" for s in rows
             if s["contestant"] == "serve" and (s["prompt"], s["repeat"]) == (r["prompt"], r["repeat"])]
    summary["overhead_per_token_median_of_pairs"] = median(
        r["tokens_per_second"] / s["tokens_per_second"] - 1 for r, s in pairs)
    served = [r for r in rows if "http_s" in r]
    summary["http_ms_per_token"] = 1000 * sum(r["http_s"] for r in served) / sum(
        r["new_tokens"] for r in served)
    print(json.dumps(summary, indent=2))
    if args.out:
        doc = {"command": " ".join(["python bench/serve_overhead.py", *[
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out" and v is not None]]),
               "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                           "torch": torch.__version__},
               "profile": profile.name, "prompts": prompts, "rows": rows, "summary": summary}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=2)
    server.stop()
    thread.join(30)


if __name__ == "__main__":
    main()
