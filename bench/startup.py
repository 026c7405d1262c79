"""Start-up cost of `specgen run`, beside the cost of importing torch and transformers.

For each demo profile, side by side in one run (contestants interleaved by specgen's bench
harness, order rotated on each repeat): `python -c "import torch, transformers"` (wall time,
peak RSS), `specgen run -p PROFILE -n 1 hi` (wall time to exit, peak RSS), and the bytes of
the weights the profile runs with (counted once per profile in a separate process that loads
the session: every tensor the loaded models hold, each once, fbgemm's packed int8 layers at a
byte a weight). The models must already be converted and cached (run each profile once first).

Targets (issue #39): wall <= 1.5x the import's, peak RSS <= the import's + 1.2x the weights.

`--warm`: each timed run follows an untimed run of the same command, so that it is a second
run with that profile's files in the page cache (the issue's "second and later runs"); without
it, the other profiles' runs in between (about 20 GB of weights together, on a 24 GB machine)
evict part of them, and a timed run reads them from disk again.

    python bench/startup.py                       # every runnable demo profile, 3 repeats
    python bench/startup.py --src /tmp/old/src    # another checkout's code
    python bench/startup.py -p qwen-coder-demo --repeats 5 --out startup.json
    python bench/startup.py --warm                # each timed run a second run
    # two checkouts side by side, each with its own cache folder:
    python bench/startup.py --variant before=/tmp/old/src:$HOME/.cache/specgen \
                            --variant after=src:/tmp/new-cache

The history of these runs goes to a temporary database, never the user's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # this checkout's bench harness, whichever --src is measured
from specgen.bench.harness import interleave, median  # noqa: E402
DEMO = ["qwen-coder-demo", "qwen-coder-demo-fp32", "qwen-coder-demo-int8",
        "qwen-coder-demo-int8-int4", "qwen-coder-demo-int4",
        "qwen-coder-demo-llamacpp", "qwen-coder-demo-int8-llamacpp"]

WEIGHTS = r"""
import json, sys
import torch
from specgen.app.session import open_session
from specgen.kernels.gguf import GGUFWeight
from specgen.profiles import load_profile

def tensors(model):
    for m in model.modules():
        for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
            yield t
        for w in (getattr(m, "weight", None), getattr(m, "stored", None)):
            if isinstance(w, GGUFWeight):  # a GGUF file's blocks as stored (mapped)
                yield w.data
        joined = getattr(m, "joined", None)
        if joined is not None:
            yield from (t for t in (joined.packed, joined.scales, joined.bias) if t is not None)
        if getattr(m, "kind", None) == "int8-dyn" and getattr(m, "packed", None) is not None:
            yield ("int8", m.in_features * m.out_features + 4 * m.out_features)

def weight_bytes(model):
    seen, total = set(), 0
    for t in tensors(model):
        if isinstance(t, tuple):
            total += t[1]
            continue
        if t is None or t.device.type == "meta":
            continue
        key = (t.data_ptr(), t.numel() * t.element_size())
        if key not in seen:
            seen.add(key)
            total += key[1]
    return total

session = open_session(load_profile(sys.argv[1]))
pair = session.pair
n = weight_bytes(pair.target)
if pair.draft is not None and isinstance(pair.draft, torch.nn.Module):
    n += weight_bytes(pair.draft)
print(json.dumps({"weights": n}))
"""


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, exit code) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr.read().decode(errors="replace")[-2000:])
    return wall, usage.ru_maxrss * 1024, proc.returncode


def runnable(profile: str, env: dict[str, str]) -> bool:
    if "llamacpp" not in profile:
        return True
    check = [sys.executable, "-c", "import llama_cpp"]
    return subprocess.run(check, env=env, capture_output=True).returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-p", "--profile", action="append", help="a profile (repeatable); default: the demo ones")
    ap.add_argument("--src", default=str(ROOT / "src"), help="the specgen source folder to run")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=SRC[:CACHE_DIR] (repeatable): measure several checkouts interleaved")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="write every measurement as JSON here")
    ap.add_argument("--warm", action="store_true",
                    help="run each command once, untimed, right before its timed run")
    args = ap.parse_args()

    db = Path(tempfile.mkdtemp(prefix="specgen-startup-")) / "history.sqlite3"
    base = dict(os.environ, HF_HUB_OFFLINE="1", SPECGEN_STATS_DB=str(db))
    variants = {}
    for v in args.variant or [f"this={args.src}"]:
        name, _, rest = v.partition("=")
        src, _, cache = rest.partition(":")
        env = dict(base, PYTHONPATH=str(Path(src).resolve()))
        if cache:
            env["SPECGEN_CACHE_DIR"] = cache
        variants[name] = env
    first = next(iter(variants.values()))
    profiles = [p for p in (args.profile or DEMO) if runnable(p, first)]
    skipped = [p for p in (args.profile or DEMO) if p not in profiles]
    if skipped:
        print(f"skipped (llama-cpp-python is not installed): {', '.join(skipped)}")

    label = (lambda v, p: p) if len(variants) == 1 else (lambda v, p: f"{v}:{p}")
    weights = {}
    for v, env in variants.items():
        for p in profiles:
            out = subprocess.run([sys.executable, "-c", WEIGHTS, p], env=env, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{label(v, p)}: could not load the session:\n{out.stderr[-2000:]}")
            weights[label(v, p)] = json.loads(out.stdout.strip().splitlines()[-1])["weights"]

    contestants = [("import", None, None)] + [(label(v, p), v, p) for p in profiles for v in variants]
    by_name = {c[0]: c for c in contestants}

    def call(name: str, _prompt: int, r: int) -> tuple[float, int]:
        _, v, p = by_name[name]
        if v is None:
            cmd, env = [sys.executable, "-c", "import torch, transformers"], first
        else:
            cmd = [sys.executable, "-m", "specgen", "run", "-p", p, "-n", "1", "hi"]
            env = variants[v]
        if args.warm:
            timed(cmd, env)
        wall, rss, rc = timed(cmd, env)
        if rc != 0:
            sys.exit(f"{name} exited {rc}")
        print(f"  repeat {r + 1}: {name:40s} {wall:6.2f} s  {rss / 1e9:5.2f} GB", flush=True)
        return wall, rss

    trials = interleave(list(by_name), 1, call, repeats=args.repeats)
    runs = {name: [t.value for t in trials if t.name == name] for name in by_name}

    imp_wall = median(w for w, _ in runs["import"])
    imp_rss = median(m for _, m in runs["import"])
    print(f"\nimport torch, transformers: {imp_wall:.2f} s, {imp_rss / 1e9:.2f} GB "
          f"(median of {args.repeats})\n")
    print("| profile | wall (median, min-max) | x import | peak RSS | weights | RSS target | wall ok | RSS ok |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for name, v, p in contestants[1:]:
        walls = [w for w, _ in runs[name]]
        rss = median(m for _, m in runs[name])
        wall = median(walls)
        limit = imp_rss + 1.2 * weights[name]
        row = {"profile": p, "variant": v, "wall_s": wall, "walls": walls, "rss": rss,
               "rss_all": [m for _, m in runs[name]], "weights": weights[name],
               "wall_ratio": wall / imp_wall, "rss_limit": limit,
               "wall_ok": wall <= 1.5 * imp_wall, "rss_ok": rss <= limit}
        rows.append(row)
        print(f"| {name} | {wall:.2f} s ({min(walls):.2f}-{max(walls):.2f}) | {wall / imp_wall:.2f}x "
              f"| {rss / 1e9:.2f} GB | {weights[name] / 1e9:.2f} GB | {limit / 1e9:.2f} GB "
              f"| {'yes' if row['wall_ok'] else 'no'} | {'yes' if row['rss_ok'] else 'no'} |")
    if args.out:
        doc = {"variants": {v: {"src": e["PYTHONPATH"], "cache": e.get("SPECGEN_CACHE_DIR")}
                            for v, e in variants.items()},
               "repeats": args.repeats, "warm": args.warm, "python": sys.version.split()[0],
               "import": {"wall_s": imp_wall, "rss": imp_rss, "all": runs["import"]},
               "profiles": rows, "skipped": skipped}
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
