"""A stand-in for llama.cpp's `llama-speculative-simple` (what `make llamacpp` builds): a small
Python script that prints what the real tool prints, in its format (copied from a run of the
real one, llama.cpp 0.5.0-dev from llama-cpp-python 0.3.36's sdist: REAL_STDOUT, REAL_STDERR),
and records the command line it got.

Its "tokenizer" reads one token a character (the tiny GGUF's byte-level tokenizer does the same
on text of distinct letters), it answers with the letters of ANSWER (one token each) and, like
the real tool, makes one token more than -n asks, or stops at the end of the answer with an end
token it does not print."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

ANSWER = "abcdefghijklmnopqrstuvwxyz"

# A real run's whole output (on a 2-core machine other work kept busy: hence its slow figures):
# `llama-speculative-simple -m qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
# -md qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --spec-type draft-simple -p PROMPT --no-escape
# -n 15 ... --spec-draft-n-max 8` (PROMPT: Qwen's chat template around "write quicksort in
# python"). stdout holds the prompt's echo and the answer; stderr the log.
REAL_PROMPT = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
               "assistant.<|im_end|>\n<|im_start|>user\nwrite quicksort in python<|im_end|>\n"
               "<|im_start|>assistant\n")
REAL_STDOUT = (
    '\n'
    '\n'
    '<|im_start|>system\n'
    'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n'
    '<|im_start|>user\n'
    'write quicksort in python<|im_end|>\n'
    '<|im_start|>assistant\n'
    'Certainly! Quicksort is a highly efficient sorting algorithm that uses a divide-and-conquer approach. Here\n'
    '\n'
    '\n'
    '\n'
)

SCRIPT = r'''#!{python}
import json, sys, time
from pathlib import Path

here = Path(__file__).parent
args = sys.argv[1:]
with open(here / "calls.jsonl", "a") as f:
    f.write(json.dumps(args) + "\n")
if args == ["--version"]:
    sys.stderr.write("version: 1 (fake)\nbuilt with a test for Linux x86_64\n")
    sys.exit(0)
settings = json.loads((here / "fake.json").read_text()) if (here / "fake.json").exists() else {{}}
if settings.get("fail"):
    sys.stderr.write("llama_model_load: error loading model: " + settings["fail"] + "\n")
    sys.exit(1)
value = lambda name: args[args.index(name) + 1]
prompt = value("-p")
n_predict = int(value("-n"))
answer = settings.get("answer", {answer!r})
made = answer[:n_predict + 1]  # the real tool stops once past -n
n_new = len(made) + (1 if len(made) < n_predict + 1 else 0)  # an end token, not printed
n_prompt = settings.get("prompt_tokens", len(prompt))
enc, dec = settings.get("encoded_seconds", 0.25), settings.get("decoded_seconds", 0.5)
drafted, accepted = settings.get("drafted", 2 * n_new), settings.get("accepted", n_new // 2)
sys.stdout.write("\n\n" + prompt + made + "\n\n" + "\n\n")
sys.stderr.write({log_head!r})
sys.stderr.write({log_tail!r}.format(n_prompt=n_prompt, enc=enc, tps_enc=n_prompt / enc,
                 n_new=n_new, dec=dec, tps_dec=n_new / dec, n_max=value("--spec-draft-n-max"),
                 drafted=drafted, accepted=accepted, rate=100.0 * accepted / max(drafted, 1)))
'''

LOG_HEAD = (
    "0.02.697.322 W load: control-looking token: 128247 '</s>' was not control-type; this is probably a bug in the model. its type will be overridden\n"
    '0.04.210.129 I cmn          init: llama threadpool init, n_threads = 2\n'
    "0.09.899.400 I common_speculative_init_result: loading draft model '/tmp/gg/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf'\n"
    "0.10.357.330 W load: control-looking token: 128247 '</s>' was not control-type; this is probably a bug in the model. its type will be overridden\n"
)
# The rest, its figures made fields (str.format)
LOG_TAIL = (
    '1.10.754.307 I encoded {n_prompt:4d} tokens in {enc:8.3f} seconds, speed: {tps_enc:8.3f} t/s\n'
    '1.10.754.327 I decoded {n_new:4d} tokens in {dec:8.3f} seconds, speed: {tps_dec:8.3f} t/s\n'
    '1.10.754.332 I \n'
    '1.10.754.337 I n_draft   = {n_max}\n'
    '1.10.754.342 I n_predict = {n_new}\n'
    '1.10.754.347 I n_drafted = {drafted}\n'
    '1.10.754.352 I n_accept  = {accepted}\n'
    '1.10.754.357 I accept    = {rate:.3f}%\n'
    '1.10.754.361 I \n'
    '1.10.754.366 I draft:\n'
    '\n'
    '1.10.754.424 I \n'
    '1.10.754.430 I target:\n'
    '\n'
    '1.10.754.443 I common_perf_print:    sampling time =       7.34 ms\n'
    '1.10.754.448 I common_perf_print:    samplers time =       1.97 ms /    21 tokens\n'
    '1.10.754.459 I common_perf_print:        load time =    7875.14 ms\n'
    '1.10.754.465 I common_perf_print: prompt eval time =   37113.08 ms /    80 tokens (  463.91 ms per token,     2.16 tokens per second)\n'
    '1.10.754.471 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)\n'
    '1.10.754.476 I common_perf_print:       total time =   60855.18 ms /    81 tokens\n'
    '1.10.754.482 I common_perf_print: unaccounted time =   23734.76 ms /  39.0 %      (total - sampling - prompt eval - eval) / (total)\n'
    '1.10.754.486 I common_perf_print:    graphs reused =          3\n'
)
# The real run's log: the template with that run's figures gives it byte for byte.
REAL_STDERR = LOG_HEAD + LOG_TAIL.format(
    n_prompt=34, enc=8.870, tps_enc=34 / 8.870, n_new=21, dec=44.225, tps_dec=21 / 44.225,
    n_max=8, drafted=39, accepted=15, rate=100.0 * 15 / 39)


class FakeTools:
    """A folder holding the fake `llama-speculative-simple`; `configure(...)` sets what it
    answers (answer, prompt_tokens, encoded_seconds, decoded_seconds, drafted, accepted, fail),
    `calls()` lists the command lines it got (argv without the program)."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.tool = bin_dir / "llama-speculative-simple"

    def configure(self, **settings) -> None:
        (self.bin / "fake.json").write_text(json.dumps(settings))

    def calls(self) -> list[list[str]]:
        path = self.bin / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def write_fake_tools(bin_dir: Path) -> FakeTools:
    """The fake tool in `bin_dir` (made), runnable, and a `lib/libllama.so` beside the folder
    (an empty file: what the finder looks for)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir.parent / "lib").mkdir(exist_ok=True)
    (bin_dir.parent / "lib" / "libllama.so").write_bytes(b"")
    tools = FakeTools(bin_dir)
    tools.tool.write_text(SCRIPT.format(python=sys.executable, answer=ANSWER, log_head=LOG_HEAD,
                                        log_tail=LOG_TAIL))
    tools.tool.chmod(tools.tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return tools


def fake_tools_in_cache(version: str = "0.3.36") -> FakeTools:
    """The fake tool where `make llamacpp` puts the real one, under $SPECGEN_CACHE_DIR."""
    return write_fake_tools(Path(os.environ["SPECGEN_CACHE_DIR"]) / "llama.cpp" / version / "bin")


# What specgen reads from REAL_STDOUT and REAL_STDERR.
REAL_PARSED = dict(
    text="Certainly! Quicksort is a highly efficient sorting algorithm that uses a "
         "divide-and-conquer approach. Here",
    prompt_tokens=34, prompt_seconds=8.87, new_tokens=21, decode_seconds=44.225, drafted=39,
    accepted=15)
