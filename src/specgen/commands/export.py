"""A profile as the command line of an engine that scales out: `vllm serve` with its
`--speculative-config`, or llama.cpp's `llama-server` with its draft and speculation flags.

Names follow the engines' current releases (docs/scale-out.md names the versions and the
sources). Where a profile has something the engine cannot do, a `#` comment above the
command says what is lost (adaptive K, the prompt-lookup half of hybrid); where the engine
has no equivalent at all (a layer-skipping `self` draft in vLLM, an EAGLE head in
llama.cpp), `Unsupported` says so in one line instead of a wrong command. Nothing is loaded:
model sizes come from the names."""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from specgen.choices import BNB_SCHEMES, CPU_SCHEMES, GPU_SCHEMES, HEAD_KINDS, MODEL_METHODS
from specgen.errors import ConfigError
from specgen.loading.memory import rough_params
from specgen.profiles import ModelSpec, Profile

VLLM_VERSION = "vLLM 0.29"
LLAMACPP_VERSIONS = {
    "current": "llama.cpp builds from late April 2026 on (b9000 and newer)",
    "legacy": "llama.cpp builds before late April 2026 (before b9000)",
}
FLAVORS = tuple(LLAMACPP_VERSIONS)
# Weights may take this share of a GPU; the rest holds the KV cache and activations.
WEIGHT_SHARE = 0.5
# The target schemes vLLM reproduces with its in-flight bitsandbytes 4-bit quantization.
VLLM_4BIT = ("nf4", *GPU_SCHEMES)


class Unsupported(ConfigError):
    """The profile has no equivalent in the engine (one line, exit 2)."""


@dataclass
class Command:
    """A command line and the comments that go above it."""

    program: str
    args: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, flag: str, value: object | None = None) -> None:
        self.args.append(flag if value is None else f"{flag} {shlex.quote(str(value))}")

    def text(self) -> str:
        lines = [f"# {note}" for note in self.notes]
        parts = [self.program, *self.args]
        lines.append(" \\\n  ".join(parts))
        return "\n".join(lines) + "\n"


# --- models -------------------------------------------------------------------------------

GGUF_QUANT = re.compile(r"(?i)[-_.](i?q\d(?:_[a-z0-9]+)*|bf16|f16|f32)\.gguf$")


def _is_gguf(spec: ModelSpec) -> bool:
    return bool(spec.gguf_file) or spec.model.endswith(".gguf")


def _is_local(spec: ModelSpec) -> bool:
    return spec.model.startswith((".", "/", "~")) or Path(spec.model).expanduser().exists()


def _original_repo(spec: ModelSpec) -> str | None:
    """The repo of a GGUF's original weights, where the GGUF repo is named after them
    ("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF" -> "Qwen/Qwen2.5-Coder-1.5B-Instruct")."""
    if _is_local(spec) or not re.search(r"(?i)-gguf$", spec.model):
        return None
    return spec.model[: -len("-gguf")]


def _vllm_model(spec: ModelSpec, role: str, notes: list[str]) -> str:
    """The model vLLM should load for a profile's target or draft."""
    if not _is_gguf(spec):
        return spec.model
    original = _original_repo(spec)
    if original is None:
        raise Unsupported(
            f"No vLLM equivalent: the {role} is the GGUF file {spec.gguf_file or spec.model}, "
            f"and vLLM needs the model's original Hugging Face weights: point {role}.model at "
            "them and export again.")
    notes.append(f"The {role} is a GGUF file ({spec.gguf_file}); vLLM serves the original "
                 f"weights, {original}, so outputs follow those, not the quantized file.")
    return original


def _llama_model(spec: ModelSpec, role: str, notes: list[str]) -> list[str]:
    """llama-server's arguments naming a target or draft: a local file, a Hugging Face repo
    and file, or the name of a GGUF the user must convert first."""
    q = shlex.quote
    draft = role != "target"
    if _is_gguf(spec) and _is_local(spec):
        path = spec.model if spec.model.endswith(".gguf") else str(Path(spec.model) / spec.gguf_file)
        return [f"{'-md' if draft else '-m'} {q(path)}"]
    if _is_gguf(spec):
        if not draft:
            return [f"-hf {q(spec.model)}", f"--hf-file {q(spec.gguf_file)}"]
        quant = GGUF_QUANT.search(spec.gguf_file or "")
        if quant:  # the draft has no file flag of its own: the repo and the quantization name it
            return [f"-hfd {q(spec.model + ':' + quant.group(1).upper())}"]
        notes.append(f"Download {spec.gguf_file} from {spec.model} first (llama-server picks a "
                     "draft file by quantization name, and this name has none).")
        return [f"-md {q(spec.gguf_file)}"]
    name = Path(spec.model.rstrip("/")).name + ".gguf"
    notes.append(f"The {role} {spec.model} has no GGUF file: convert it with llama.cpp's "
                 f"convert_hf_to_gguf.py to {name} first.")
    return [f"{'-md' if draft else '-m'} {q(name)}"]


def _head(profile: Profile) -> ModelSpec:
    """The trained head of an eagle / eagle3 / medusa profile."""
    head = getattr(profile, "head", None) or profile.draft
    if head is None:
        raise Unsupported(f"Profile {profile.name!r} uses method {profile.speculation.method!r} "
                          "but names no head model to export.")
    return head


# --- vLLM ---------------------------------------------------------------------------------

def _draft_k(spec, cmd: Command, off: str, adaptive: str) -> int:
    """The profile's K, with the note for K = 0 (speculation off: `off`, the flags left out;
    the caller stops there) or for adaptive K (`adaptive`, which names {k}: the server drafts
    at most the profile's largest K)."""
    k = spec.num_speculative_tokens
    if k == 0:
        cmd.notes.append(f"Speculation is off in this profile (K = 0): no {off}.")
    elif spec.adaptive:
        cmd.notes.append(adaptive.format(k=k))
    return k


def tensor_parallel(profile: Profile, gpu_gb: float) -> tuple[int, int, str]:
    """(tensor parallel size, pipeline parallel size, why): the fewest GPUs (1, 2, 4 or 8
    per stage) that hold the weights in WEIGHT_SHARE of each GPU's memory."""
    specs = [profile.target]
    if profile.draft is not None and profile.speculation.method in MODEL_METHODS:
        specs.append(profile.draft)
    total = 0.0
    for spec in specs:
        params = rough_params(spec.model) or rough_params(spec.gguf_file or "")
        if params is None:
            return 1, 1, (f"Tensor parallel size 1: the size of {spec.model} is not in its name; "
                          "raise --tensor-parallel-size if the weights do not fit one GPU.")
        width = (0.53 if spec.quantization in VLLM_4BIT else
                 4 if spec.dtype == "float32" and spec.quantization not in CPU_SCHEMES else 2)
        total += params * width
    budget = gpu_gb * 1e9 * WEIGHT_SHARE
    pp = max(1, math.ceil(total / (8 * budget)))
    tp = next(n for n in (1, 2, 4, 8) if total / (n * pp) <= budget)
    where = f"{tp * pp} GPUs" if tp * pp > 1 else "one GPU"
    return tp, pp, (f"Tensor parallel size {tp}{f', pipeline parallel size {pp}' if pp > 1 else ''}: "
                    f"about {total / 1e9:.1f} GB of weights over {where} of {gpu_gb:g} GB "
                    f"(--gpu-memory), half of each left for the KV cache.")


def vllm(profile: Profile, gpu_gb: float = 80.0, port: int = 8000) -> Command:
    """`vllm serve` for the profile."""
    if gpu_gb <= 0:
        raise ConfigError(f"--gpu-memory must be a positive number of GB, got {gpu_gb:g}.")
    spec, method = profile.speculation, profile.speculation.method
    if method == "self":
        raise Unsupported("No vLLM equivalent for method \"self\" (the target drafting with "
                          "layers skipped): vLLM has no layer-skipping drafter; train an EAGLE "
                          "head, or use a draft model.")
    if method not in ("draft-model", "prompt-lookup", "hybrid", *HEAD_KINDS):
        raise Unsupported(f"No vLLM equivalent known for method {method!r}; vLLM drafts with "
                          "draft_model, ngram, eagle, eagle3, medusa or mtp.")
    cmd = Command("vllm serve", notes=[f"specgen profile {profile.name} for {VLLM_VERSION}."])
    target = _vllm_model(profile.target, "target", cmd.notes)
    draft = None
    if method in MODEL_METHODS and spec.num_speculative_tokens:
        assert profile.draft is not None  # profiles.py: these methods need a [draft]
        draft = _vllm_model(profile.draft, "draft", cmd.notes)
    cmd.program = f"vllm serve {shlex.quote(target)}"
    tp, pp, why = tensor_parallel(profile, gpu_gb)
    cmd.notes.append(why)
    cmd.add("--port", port)
    cmd.add("--tensor-parallel-size", tp)
    if pp > 1:
        cmd.add("--pipeline-parallel-size", pp)
    quant = profile.target.quantization
    if profile.target.dtype != "auto" and quant not in CPU_SCHEMES:  # those pick their own dtype
        cmd.add("--dtype", profile.target.dtype)
    if quant in VLLM_4BIT:
        cmd.add("--quantization", "bitsandbytes")
        if quant in GPU_SCHEMES:
            cmd.notes.append(f"target.quantization = {quant} is specgen's own 4-bit GPU format; "
                             "vLLM quantizes the weights to bitsandbytes' 4-bit on load instead "
                             "(the same memory, other rounding).")
    elif quant != "none":
        kind = "bitsandbytes'" if quant in BNB_SCHEMES else "specgen's own CPU"
        cmd.notes.append(f"target.quantization = {quant} is {kind} scheme with no vLLM "
                         "equivalent: vLLM loads the weights unquantized.")
    k = _draft_k(spec, cmd, "--speculative-config", "vLLM drafts a fixed K: num_speculative_tokens = "
                 "{k}, the profile's largest K (specgen's adaptive K has no vLLM equivalent).")
    if k == 0:
        return cmd
    config: dict = {}
    if spec.draft_confidence > 0:
        cmd.notes.append(f"draft_confidence = {spec.draft_confidence:g} has no vLLM equivalent: "
                         "vLLM drafts all K tokens.")
    if draft is not None:
        config = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
        if tp > 1:
            config["draft_tensor_parallel_size"] = 1
        if method == "hybrid":
            cmd.notes.append("vLLM has no hybrid of a draft model and prompt lookup: this uses "
                             "the draft model alone.")
    elif method == "prompt-lookup":
        config = {"method": "ngram", "num_speculative_tokens": k,
                  "prompt_lookup_max": spec.max_ngram, "prompt_lookup_min": spec.min_ngram}
    else:
        head = _head(profile)
        config = {"method": method, "model": _vllm_model(head, "head", cmd.notes),
                  "num_speculative_tokens": k}
        cmd.notes.append(f"The {method} head must be a checkpoint in the layout vLLM loads "
                         "(as its authors publish it).")
    cmd.add("--speculative-config", json.dumps(config, separators=(",", ":")))
    return cmd


# --- llama.cpp ----------------------------------------------------------------------------

def llamacpp(profile: Profile, flavor: str = "current", port: int = 8080) -> Command:
    """`llama-server` for the profile, with the flags of the `current` builds or the
    `legacy` ones (before the speculative flags were renamed)."""
    if flavor not in FLAVORS:
        raise ConfigError(f"--flavor must be current or legacy, got {flavor!r}.")
    legacy = flavor == "legacy"
    spec, method = profile.speculation, profile.speculation.method
    if method == "self" or (method in HEAD_KINDS and (method != "eagle3" or legacy)):
        what = ("the target drafting with layers skipped" if method == "self"
                else f"an {method} head")
        raise Unsupported(f"No llama.cpp equivalent for method {method!r} ({what}) in "
                          f"{LLAMACPP_VERSIONS[flavor]}; use a draft model"
                          f"{'' if legacy else ', or an EAGLE-3 head (draft-eagle3)'}.")
    if method not in ("draft-model", "prompt-lookup", "hybrid", *HEAD_KINDS):
        raise Unsupported(f"No llama.cpp equivalent known for method {method!r}; llama-server "
                          "drafts with a draft model, n-gram lookup, EAGLE-3 or MTP.")
    cmd = Command("llama-server", notes=[f"specgen profile {profile.name} for "
                                         f"{LLAMACPP_VERSIONS[flavor]}."])
    cmd.args += _llama_model(profile.target, "target", cmd.notes)
    if profile.target.quantization != "none":
        cmd.notes.append(f"target.quantization = {profile.target.quantization} does not apply: "
                         "llama.cpp runs the GGUF file's own quantization.")
    cmd.add("--host", "127.0.0.1")
    cmd.add("--port", port)  # always given: the default port differs between builds
    cmd.add("--jinja")  # the model's own chat template
    if legacy:
        cmd.add("-ngl", 99)  # the current builds offload all they can by default
    k = _draft_k(spec, cmd, "draft flags", "llama.cpp drafts at most K = {k} tokens a step (the "
                 "profile's largest K); specgen's adaptive K has no equivalent.")
    if k == 0:
        return cmd
    types: list[str] = []
    flags = Command("")
    if method in ("prompt-lookup", "hybrid"):
        if legacy and method == "hybrid":
            cmd.notes.append("Legacy builds cannot combine a draft model with n-gram lookup: "
                             "this uses the draft model alone.")
        else:
            types.append("ngram-simple")
            size_n, size_m = (("--spec-ngram-size-n", "--spec-ngram-size-m") if legacy else
                              ("--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m"))
            flags.add(size_n, spec.max_ngram)
            flags.add(size_m, k)
            if spec.min_ngram < spec.max_ngram:
                cmd.notes.append(f"ngram-simple looks up n-grams of one length (max_ngram = "
                                 f"{spec.max_ngram}); specgen also tries shorter ones down to "
                                 f"min_ngram = {spec.min_ngram}.")
    if method in ("draft-model", "hybrid", "eagle3"):
        draft = _head(profile) if method == "eagle3" else profile.draft
        assert draft is not None  # profiles.py: these methods need a [draft]
        types.append("draft-eagle3" if method == "eagle3" else "draft-simple")
        flags.args += _llama_model(draft, "head" if method == "eagle3" else "draft", cmd.notes)
        if legacy:  # a draft model alone turns speculation on; --spec-type is for n-grams there
            flags.add("-ngld", 99)
            flags.add("--draft-max", k)
            flags.add("--draft-min", 0)
            flags.add("--draft-p-min", spec.draft_confidence)  # legacy defaults were 0.75 to 0.9
        else:
            flags.add("--spec-draft-n-max", k)
            if spec.draft_confidence > 0:
                flags.add("--spec-draft-p-min", spec.draft_confidence)
        if method == "eagle3":
            cmd.notes.append("The EAGLE-3 head must be a GGUF made with llama.cpp's "
                             "convert_hf_to_gguf.py --target-model-dir.")
    if not (legacy and "ngram-simple" not in types):
        cmd.add("--spec-type", ",".join(types))
    cmd.args += flags.args
    return cmd
