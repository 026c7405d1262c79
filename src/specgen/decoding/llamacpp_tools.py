"""llama.cpp's own programs, built natively by `make llamacpp` (scripts/build_llamacpp.sh) into
specgen's cache, `<cache>/llama.cpp/<version>/bin` and `lib`: finding them, pointing the Python
bindings at the same library, and running `llama-speculative-simple`, llama.cpp's speculative
decoding of a target and a draft GGUF file, for the bench's `llamacpp-spec` contestant.

`<version>` is the llama-cpp-python release whose sdist carried the llama.cpp source
(requirements/llama.txt). $SPECGEN_LLAMACPP_BIN names another folder of the tools (its
sibling `lib` holds their libraries)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specgen.choices import LLAMACPP_DRAFT_N_MAX, LLAMACPP_DRAFT_P_MIN
from specgen.errors import ConfigError, ModelError
from specgen.paths import cache_dir

ENV_BIN = "SPECGEN_LLAMACPP_BIN"
SPECULATIVE = "llama-speculative-simple"
BUILD_HINT = "run `make llamacpp` to build llama.cpp's tools (about 11 minutes on 2 cores)"


def root() -> Path:
    return cache_dir() / "llama.cpp"


def _version_key(folder: Path) -> tuple:
    return tuple(int(x) if x.isdigit() else -1 for x in re.split(r"[.\-]", folder.name))


def bin_dir() -> Path | None:
    """The folder of llama.cpp's tools: $SPECGEN_LLAMACPP_BIN where set (whether or not it
    holds them), else the newest `<cache>/llama.cpp/<version>/bin` that holds
    llama-speculative-simple; None where there is none."""
    if value := os.environ.get(ENV_BIN):
        return Path(value).expanduser()
    if not root().is_dir():
        return None
    built = [d for d in root().iterdir() if (d / "bin" / SPECULATIVE).is_file()]
    return max(built, key=_version_key) / "bin" if built else None


def tool(name: str = SPECULATIVE) -> Path | None:
    """The program `name` of the build, where it is there and runnable."""
    folder = bin_dir()
    path = folder / name if folder is not None else None
    return path if path is not None and path.is_file() and os.access(path, os.X_OK) else None


def missing_line(name: str = SPECULATIVE) -> str:
    """The one line a command prints where the tools are not there."""
    where = (f"${ENV_BIN} ({os.environ[ENV_BIN]})" if os.environ.get(ENV_BIN)
             else f"{root()}/<version>/bin")
    return f"{name} is not in {where}: {BUILD_HINT}."


def lib_dir() -> Path | None:
    """The build's shared libraries (libllama.so ...), beside its bin folder."""
    folder = bin_dir()
    lib = folder.parent / "lib" if folder is not None else None
    return lib if lib is not None and any(lib.glob("libllama.*")) else None


def point_bindings(bindings_version: str | None, bundled: bool) -> Path | None:
    """Point llama-cpp-python at the build's libllama (LLAMA_CPP_LIB_PATH, which it reads when
    it is first imported), so that the `llamacpp` contestant and a llama.cpp draft run the same
    native build as `llamacpp-spec`. Only where the user has not set the variable, and where
    the bindings were installed without a library of their own (`make llamacpp` installs them
    so) or are the release the build came from: another release's ctypes signatures may not fit
    this library. Returns the folder pointed at, or None."""
    if os.environ.get("LLAMA_CPP_LIB_PATH") or bindings_version is None:
        return None
    lib = lib_dir()
    if lib is None or (bundled and lib.parent.name != bindings_version):
        return None
    os.environ["LLAMA_CPP_LIB_PATH"] = str(lib)
    return lib


# --- llama-speculative-simple ------------------------------------------------------------------

@dataclass(frozen=True)
class DraftSettings:
    """llama.cpp's own draft settings: at most `n_max` tokens a draft, and a draft ends where
    the draft model's probability of its token falls below `p_min` (0: never). The default is
    the best of a sweep on the demo pair (docs/benchmarks.md)."""

    n_max: int = LLAMACPP_DRAFT_N_MAX
    p_min: float = LLAMACPP_DRAFT_P_MIN

    def text(self) -> str:
        return f"n_max={self.n_max},p_min={self.p_min:g}"

    @classmethod
    def parse(cls, text: str | None) -> DraftSettings:
        """'n_max=8,p_min=0.75' (either may be left out: the default's)."""
        if not text or not text.strip():
            return cls()
        values: dict = {}
        for part in text.split(","):
            key, sep, value = (s.strip() for s in part.partition("="))
            key = key.replace("-", "_")
            try:
                if not sep or key not in ("n_max", "p_min") or key in values:
                    raise ValueError
                values[key] = int(value) if key == "n_max" else float(value)
            except ValueError:
                raise ConfigError(f"--llamacpp-draft {text!r}: give n_max=N,p_min=P (e.g. "
                                  f"{cls().text()}).") from None
        made = cls(**values)
        if not 1 <= made.n_max <= 64:
            raise ConfigError(f"--llamacpp-draft: n_max must be from 1 to 64, got {made.n_max}.")
        if not 0.0 <= made.p_min < 1.0:
            raise ConfigError(f"--llamacpp-draft: p_min must be in [0, 1), got {made.p_min}.")
        return made


@dataclass
class SpecRun:
    """What llama-speculative-simple printed about one generation."""

    text: str  # the generated text (the end token is not printed), maybe past what was asked
    prompt_tokens: int  # as llama.cpp tokenized the prompt
    prompt_seconds: float  # the prompt, all but its last token, through target and draft
    new_tokens: int  # generated, an end token included: up to n_max more than asked
    decode_seconds: float
    drafted: int
    accepted: int
    peak_memory_bytes: int = 0

    @property
    def seconds(self) -> float:
        return self.prompt_seconds + self.decode_seconds

    @property
    def target_passes(self) -> int:
        """Each verify pass keeps its accepted drafts and one token of the target's own."""
        return self.new_tokens - self.accepted


_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


def command(tool_path: Path, target: Path, draft: Path, prompt: str, max_new_tokens: int,
            threads: int, n_ctx: int, settings: DraftSettings) -> list[str]:
    """The command line of one greedy generation. The prompt is the text already rendered with
    the chat template (special tokens as text): llama-speculative-simple applies no template,
    parses special tokens and adds a BOS only where the model's GGUF asks for one, like
    specgen's tokenizer; --no-escape keeps a backslash in the prompt as it is. The tool stops
    once past -n, with up to a whole step more (n_max + 1 tokens): -n max_new_tokens - 1 makes
    at least max_new_tokens where no end token comes first."""
    return [str(tool_path), "-m", str(target), "-md", str(draft), "--spec-type", "draft-simple",
            "-p", prompt, "--no-escape", "-n", str(max(max_new_tokens - 1, 0)),
            "-c", str(n_ctx),
            "--temp", "0", "--top-k", "1", "--repeat-penalty", "1.0",
            "-t", str(threads), "-tb", str(threads), "-td", str(threads), "-tbd", str(threads),
            "--spec-draft-n-max", str(settings.n_max), "--spec-draft-n-min", "0",
            "--spec-draft-p-min", f"{settings.p_min:g}",
            "--log-colors", "off"]


def parse(stdout: str, stderr: str, prompt: str) -> SpecRun:
    """The generated text from stdout (two newlines, the prompt's echo, each new token's text,
    then two newlines twice), the counts and timings from the log on stderr."""
    found = {name: pattern.search(stderr) for name, pattern in
             (("encoded", _ENCODED), ("decoded", _DECODED), ("drafted", _DRAFTED),
              ("accepted", _ACCEPTED))}
    if not all(found.values()):
        tail = " / ".join(line for line in stderr.strip().splitlines()[-3:])
        raise ModelError(f"{SPECULATIVE} printed no timings: {tail or 'no output'}")
    text = stdout
    if text.startswith("\n\n"):
        text = text[2:]
    if not text.startswith(prompt):
        raise ModelError(f"{SPECULATIVE} did not echo the prompt it was given: its output "
                         "cannot be told apart from the prompt.")
    text = text[len(prompt):]
    if text.endswith("\n\n\n\n"):
        text = text[:-4]
    return SpecRun(text=text, prompt_tokens=int(found["encoded"].group(1)),
                   prompt_seconds=float(found["encoded"].group(2)),
                   new_tokens=int(found["decoded"].group(1)),
                   decode_seconds=float(found["decoded"].group(2)),
                   drafted=int(found["drafted"].group(1)), accepted=int(found["accepted"].group(1)))


def _peak_rss(pid: int) -> int:
    """The process's resident high-water mark so far (Linux: VmHWM), or 0."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024
    except (OSError, AttributeError, ValueError):
        return 0


def run(args: list[str], prompt: str) -> SpecRun:
    """Run the tool once and parse what it printed, with its peak resident memory: its own
    VmHWM, read every 20 ms while it runs (the high-water mark only grows). Not the child's
    rusage: its maxrss counts the bench's own memory, which the child held before its exec."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as log:
        try:
            child = subprocess.Popen(args, stdout=out, stderr=log, stdin=subprocess.DEVNULL)
        except OSError as e:
            raise ConfigError(f"Cannot run {args[0]}: {e.strerror or e}; {BUILD_HINT}.") from None
        peak = 0
        try:
            while True:
                peak = max(peak, _peak_rss(child.pid))
                try:
                    child.wait(timeout=0.02)
                    break
                except subprocess.TimeoutExpired:
                    pass
        except BaseException:  # Ctrl-C: the child goes too
            child.kill()
            child.wait()
            raise
        out.seek(0)
        log.seek(0)
        stdout = out.read().decode("utf-8", errors="replace")
        stderr = log.read().decode("utf-8", errors="replace")
    if child.returncode != 0:
        tail = " / ".join(stderr.strip().splitlines()[-3:])
        raise ModelError(f"{SPECULATIVE} failed (exit {child.returncode}): {tail or 'no output'}")
    result = parse(stdout, stderr, prompt)
    result.peak_memory_bytes = peak
    return result


def version_line(tool_path: Path) -> str | None:
    """`version: N (commit)` as the tool prints it, or None."""
    try:
        done = subprocess.run([str(tool_path), "--version"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("version")]
    return lines[0].strip() if lines else None


class SpecRunner:
    """llama-speculative-simple on one target and draft GGUF pair, as the bench calls it: token
    ids in (the chat-templated prompt specgen's tokenizer made), token ids out."""

    def __init__(self, tool_path: Path, target: Path, draft: Path, tokenizer, threads: int,
                 n_ctx: int, settings: DraftSettings) -> None:
        self.tool, self.target, self.draft = tool_path, target, draft
        self.tokenizer, self.threads, self.n_ctx, self.settings = tokenizer, threads, n_ctx, settings

    def generate(self, input_ids: list[int], max_new_tokens: int, eos_ids: list[int]
                 ) -> tuple[list[int], SpecRun]:
        """The first max_new_tokens tokens (the printed text read again by specgen's tokenizer,
        and an end token where the tool stopped at one: the tool does not print it, so it is
        taken as the first of eos_ids) and the run's figures, whose count may go past
        max_new_tokens by up to a step. A prompt that llama.cpp reads as another count of
        tokens is an error: the contestants would not be answering the same prompt."""
        prompt = self.tokenizer.decode(input_ids, skip_special_tokens=False)
        got = run(command(self.tool, self.target, self.draft, prompt, max_new_tokens,
                          self.threads, self.n_ctx, self.settings), prompt)
        if got.prompt_tokens != len(input_ids):
            raise ModelError(f"{SPECULATIVE} read the prompt as {got.prompt_tokens} tokens, "
                             f"specgen as {len(input_ids)}: not the same prompt (a BOS added "
                             "twice, or a special token read as text).")
        tokens = self.tokenizer(got.text, add_special_tokens=False)["input_ids"] if got.text else []
        if got.new_tokens < max_new_tokens and eos_ids and len(tokens) < max_new_tokens:
            tokens.append(eos_ids[0])  # it stopped at an end token
        return tokens[:max_new_tokens], got
