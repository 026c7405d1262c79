"""`specgen bench` from parsed options to printed tables: validate the request (the --out file
too), load the pair (and the bf16 reference, and llama.cpp), run the contestants interleaved,
keep the JSON up to date prompt by prompt, print the tables. The CLI only parses.

The measurements stay out of the run history (`specgen stats` is what users ran); --out
keeps every figure. Ctrl-C or SIGTERM ends the bench with the figures measured so far
written and printed, then re-raised for the exit code."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from specgen.bench import report as rep
from specgen.bench import runner as b
from specgen.bench.prompts import code_categories
from specgen.choices import MAX_K, METHODS, MIN_K, STORED_SCHEME, listing
from specgen.decoding import llamacpp_tools
from specgen.errors import ConfigError
from specgen.profiles import Profile, finite, load_profile, with_overrides


@dataclass
class MeasureRequest:
    """What a measuring command (bench, tune) takes besides its own options: the profile, a
    prompts file (None: the command's own set), and how the target loads and runs."""

    profile: str
    prompts: Path | None = None
    threads: int | None = None
    device: str | None = None
    target_quantization: str | None = None
    k: int | None = None

    def check_threads(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {self.threads}.")


@dataclass
class BenchRequest(MeasureRequest):
    max_new_tokens: int = 128
    repeats: int = 1
    out_file: Path | None = None
    contestants: str | None = None  # comma-separated names; None: the defaults
    method: str | None = None
    draft_vocab: int | None = None
    draft_confidence: float | None = None
    draft_quantization: str | None = None
    draft_runtime: str | None = None
    raw: bool = False
    draft_window: int | None = None
    llamacpp_draft: str | None = None  # llamacpp-spec's draft settings: "n_max=16,p_min=0.75"

    def check(self) -> None:
        """Refuse bad values before anything loads, and an --out file that cannot be written
        (found only after the first prompt, it would cost the work done)."""
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}.")
        if self.repeats < 1:
            raise ConfigError(f"--repeats must be >= 1, got {self.repeats}.")
        self.check_threads()
        if self.k is not None and not MIN_K <= self.k <= MAX_K:
            raise ConfigError(f"--k must be from {MIN_K} to {MAX_K}, got {self.k}.")
        if self.draft_vocab is not None and self.draft_vocab < 0:
            raise ConfigError(f"--draft-vocab must be >= 0 (0: the whole vocabulary), "
                              f"got {self.draft_vocab}.")
        if self.draft_confidence is not None and not (
                0.0 <= finite(self.draft_confidence, "--draft-confidence") < 1.0):
            raise ConfigError(f"--draft-confidence must be in [0, 1), got {self.draft_confidence}.")
        llamacpp_tools.DraftSettings.parse(self.llamacpp_draft)
        if self.out_file is not None:
            check_writable(self.out_file, "--out")


def check_writable(path: Path, option: str) -> None:
    """Whether `path` can be written, by opening it for appending (which changes nothing of
    a file that exists; a file this check made is removed again)."""
    existed = path.exists()
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a directory: give a file name.")
    try:
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as e:
        raise ConfigError(f"Cannot write {option} {path}: {e.strerror or e}. Give a file in a "
                          "folder you can write.") from None
    if not existed:
        path.unlink(missing_ok=True)


def pick(request: BenchRequest, prof: Profile) -> tuple[str, dict, list[b.Contestant]]:
    """The drafting method, every contestant by name, and those that run."""
    from specgen.decoding import llamacpp
    from specgen.loading.sources import is_gguf

    method = request.method or prof.speculation.method
    if method not in METHODS:
        raise ConfigError(f"--method {method!r} is not a drafting method; choose "
                          f"{listing(METHODS)}.")
    k = request.k if request.k is not None else prof.speculation.num_speculative_tokens
    everyone = b.contestants(method, k, prof.draft is not None)
    quantized = (request.target_quantization or prof.target.quantization) != "none"
    head_kind = prof.draft.kind if prof.draft is not None else None
    default = b.default_names(everyone, quantized, llamacpp.available() and is_gguf(prof.target),
                              self_drafting=everyone["adaptive"].self_drafts, head_kind=head_kind,
                              with_llama_spec=_llamacpp_pair(prof)[2] is None)
    chosen = request.contestants
    names = [n.strip() for n in chosen.split(",") if n.strip()] if chosen else default
    unknown = [n for n in names if n not in everyone]
    if unknown or not names:
        raise ConfigError(f"Unknown contestant(s) {', '.join(unknown) or '(none given)'}; choose "
                          f"from {', '.join(everyone)}.")
    picked = [everyone[n] for n in dict.fromkeys(names)]
    stored = (request.target_quantization or prof.target.quantization) == STORED_SCHEME
    if stored and any(c.kind in ("peer", "api") for c in picked):  # they run transformers' models
        if chosen:
            raise ConfigError(f"{', '.join(c.name for c in picked if c.kind in ('peer', 'api'))} "
                              "run transformers' models, and this target runs as stored "
                              "(quantization = \"gguf\"): add --target-quantization none.")
        picked = [c for c in picked if c.kind not in ("peer", "api")]
    if any(c.needs_draft_model for c in picked) and not (prof.draft and prof.draft.has_model):
        if chosen:
            raise ConfigError(f"Profile {prof.name!r} has no draft model, which "
                              f"{', '.join(c.name for c in picked if c.needs_draft_model)} need.")
        picked = [c for c in picked if not c.needs_draft_model]
    wrong = [c.name for c in picked if c.needs_head and c.method != head_kind]
    if wrong:
        have = f"a {head_kind} head" if head_kind else "no draft head"
        raise ConfigError(f"{', '.join(wrong)} draft(s) with a head of that kind, and profile "
                          f"{prof.name!r} has {have}: set [draft] head and kind (docs/heads.md).")
    return method, everyone, picked


def _load_pair(prof: Profile, progress: Callable, heads: bool):
    """The profile's pair as bench runs it: with its draft head whenever a contestant drafts
    with it, and never on specgen's own tree (lean): the peer runs transformers' `generate`
    on these very models."""
    from specgen.loading.load import load_plan
    from specgen.loading.plan import plan_pair, with_head

    plan = plan_pair(prof, progress, lean=False)
    return load_plan(with_head(plan, prof, progress) if heads else plan, progress)


def run(request: BenchRequest, load_session: Callable, err: Console) -> None:
    """Run the bench to the end. Interrupted (Ctrl-C, SIGTERM), it writes and prints the
    figures measured so far, then re-raises."""
    request.check()
    prompt_set = b.read_prompts(request.prompts) if request.prompts else b.builtin_prompts()
    code = code_categories([p.category for p in prompt_set], builtin=request.prompts is None)
    prof = load_profile(request.profile)
    method, everyone, picked = pick(request, prof)
    spec_pair = None
    if any(c.kind == "llamacpp-spec" for c in picked):
        *spec_pair, why_not = _llamacpp_pair(prof)
        if why_not:  # asked for by name: one line, and the others run
            err.print(f"[yellow]skipped llamacpp-spec:[/] {escape(why_not)}", highlight=False,
                      soft_wrap=True)
            picked, spec_pair = [c for c in picked if c.kind != "llamacpp-spec"], None
            if not picked:
                raise ConfigError("No contestant left to run.")
    gguf = _llamacpp_gguf(prof) if any(c.kind == "llamacpp" for c in picked) else None
    needs_draft = any(c.needs_draft_model for c in picked)
    # Load the draft whenever a contestant needs it, and only then, whatever the profile's
    # own method.
    prof = with_overrides(prof, method=("draft-model" if prof.draft else None) if needs_draft
                          else "prompt-lookup",
                          chat_template=False if request.raw else None,
                          max_new_tokens=request.max_new_tokens, temperature=0.0,
                          device=request.device, target_quantization=request.target_quantization,
                          draft_quantization=request.draft_quantization,
                          draft_runtime=request.draft_runtime, draft_window=request.draft_window)
    if request.draft_vocab and prof.draft is not None and prof.draft.runtime == "llama.cpp":
        raise ConfigError("--draft-vocab trims a transformers draft's output layer; a llama.cpp "
                          "draft drafts over its whole vocabulary. Drop --draft-vocab.")
    import torch
    from transformers.utils import logging as hf_logging

    from specgen.app import skipsets
    from specgen.app.session import encode_messages, messages_for
    from specgen.core.drafters import default_skip, num_layers
    from specgen.decoding import llamacpp
    from specgen.loading.load import load_peer

    hf_logging.set_verbosity_error()  # generate's notes on generation configs are noise here
    if request.threads is not None:
        torch.set_num_threads(request.threads)
    session = load_session(prof, load=partial(_load_pair, heads=any(c.needs_head for c in picked)))
    peer = None
    if any(c.kind in ("peer", "api") for c in picked):  # a llama.cpp draft's transformers copy
        with err.status("Loading the peer's draft…") as status:
            peer = load_peer(prof, status.update)
    reference = None
    if any(c.kind == "reference" for c in picked):  # the target alone, unquantized, in bf16
        reference = load_session(with_overrides(
            prof, method="prompt-lookup", target_quantization="none",
            target_dtype="bfloat16"), lean=False).pair.target
    gen, spec = prof.generation, prof.speculation
    skip = None
    if any(c.self_drafts for c in picked):  # the pinned, tuned or default set
        skip = skipsets.resolve(prof, session.pair)
        if skip.notice:
            err.print(f"[dim]note: {escape(skip.notice)}[/]", highlight=False, soft_wrap=True)
    inputs = [encode_messages(session.tokenizer, messages_for(p.prompt, gen.system_prompt),
                              gen.chat_template) for p in prompt_set]
    runner = b.Bench(session.pair.target, session.pair.draft, request.max_new_tokens,
                     session.eos_ids(), spec.max_ngram, spec.min_ngram,
                     (spec.draft_vocab if request.draft_vocab is None else request.draft_vocab) or None,
                     spec.draft_confidence if request.draft_confidence is None
                     else request.draft_confidence,
                     reference, peer_draft=peer,
                     skip=skip.skip if skip else None, head=session.pair.head,
                     window=spec.draft_window)
    room = max(len(i) for i in inputs) + request.max_new_tokens + 16  # the longest prompt's
    if gguf is not None:  # the same threads as torch
        runner.llama = llamacpp.load(gguf, torch.get_num_threads(), room)
    spec_config = {}
    if spec_pair is not None:
        settings = llamacpp_tools.DraftSettings.parse(request.llamacpp_draft)
        tool = llamacpp_tools.tool()
        # room for the step it may make past max_new_tokens
        runner.llama_spec = llamacpp_tools.SpecRunner(tool, *spec_pair, session.tokenizer,
                                                      torch.get_num_threads(),
                                                      room + settings.n_max, settings)
        spec_config = {"llamacpp_spec": {
            "tool": str(tool), "version": llamacpp_tools.version_line(tool),
            "target_gguf": str(spec_pair[0]), "draft_gguf": str(spec_pair[1]),
            "n_max": settings.n_max, "p_min": settings.p_min, "spec_type": "draft-simple"}}
    names = [c.name for c in picked]
    config = {"profile": prof.name, "target": session.pair.target_name,
              "draft": session.pair.draft_name, "dtype": session.pair.dtype,
              "head": session.pair.head_name, "head_kind": session.pair.head.kind if session.pair.head is not None else None,
              "device": session.pair.device, "max_new_tokens": request.max_new_tokens,
              "quantization": session.pair.quantization,
              "draft_quantization": session.pair.draft_quantization,
              "draft_runtime": prof.draft.runtime if prof.draft else None,
              "repeats": request.repeats, "method": method, "k_max": everyone["adaptive"].k,
              "threads": torch.get_num_threads(), "chat_template": gen.chat_template,
              "draft_vocab": runner.drafter_options[2] or 0,
              "draft_confidence": runner.drafter_options[3],
              "draft_window": spec.draft_window,
              "code_categories": code,
              "command": "specgen " + " ".join(sys.argv[1:]), "complete": False,
              **({"skip_layers": skipsets.skip_text(skip.skip), "skip_origin": skip.origin,
                  "default_skip_layers": skipsets.skip_text(
                      default_skip(num_layers(session.pair.target)))} if skip else {}),
              **({"llamacpp_gguf": str(gguf)} if gguf is not None else {}), **spec_config}
    total = len(prompt_set) * request.repeats * len(picked)
    measurements: list = []
    warnings: list[str] = []

    def write_json() -> tuple[dict, str | None]:
        """The document, written to --out; a write that fails is a warning, never the end of
        the measuring."""
        doc = rep.report(measurements, prompt_set, names, config)
        if request.out_file is not None:
            try:
                request.out_file.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
            except OSError as e:
                return doc, f"Cannot write {request.out_file}: {e.strerror or e}."
        return doc, None

    def progress(m, stats) -> None:
        measurements.append(m)
        err.print(f"[dim][{len(measurements)}/{total}] prompt {m.prompt + 1} ({escape(m.category)}) "
                  f"{m.contestant}: {m.new_tokens} tokens, {m.tokens_per_second:.2f} tok/s[/]",
                  highlight=False)
        if len(measurements) % (len(picked) * request.repeats) == 0:
            # A long bench keeps its figures prompt by prompt.
            if (warning := write_json()[1]) and warning not in warnings:
                warnings.append(warning)
                err.print(f"[yellow]warning:[/] {escape(warning)} Measuring goes on; the "
                          "tables below keep the figures.", highlight=False)

    err.print(f"[dim]bench: {len(prompt_set)} prompts x {len(picked)} contestants x "
              f"{request.repeats} repeat(s), {request.max_new_tokens} new tokens, "
              f"{torch.get_num_threads()} threads[/]")
    stopped_by: BaseException | None = None
    try:
        b.run_bench(runner, prompt_set, inputs, picked, request.repeats, on_measurement=progress)
        config["complete"] = True
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: show and keep what was measured
        stopped_by = e
    doc, failed = write_json()
    console = Console()
    for table in rep.tables(doc):
        console.print(table)
    if stopped_by is not None:
        if failed:
            err.print(f"[yellow]warning:[/] {escape(failed)}", highlight=False)
        err.print("[yellow]interrupted:[/] the figures cover the measurements made so far.")
        raise stopped_by
    if failed:
        raise ConfigError(f"{failed} The figures are in the tables above.")


def _llamacpp_gguf(prof: Profile) -> Path:
    """The target's GGUF file, which the llamacpp contestant decodes."""
    from specgen.decoding import llamacpp
    from specgen.loading.sources import gguf_file

    if not llamacpp.available():
        raise ConfigError(f"The llamacpp contestant needs llama-cpp-python: {llamacpp.INSTALL_HINT}.")
    gguf = gguf_file(prof.target, "target", prof.path.parent if prof.path else None)
    if gguf is None:
        raise ConfigError(f"The llamacpp contestant runs the target's GGUF file, but profile "
                          f"{prof.name!r}'s target {prof.target.model!r} is not a GGUF model.")
    return gguf


def _llamacpp_pair(prof: Profile) -> tuple[Path | None, Path | None, str | None]:
    """The target's and the draft's GGUF files that llamacpp-spec decodes, or why it cannot
    run (one line): llama.cpp's tools not built, or a model that is not a GGUF file."""
    from specgen.loading.sources import gguf_file, is_gguf

    if llamacpp_tools.tool() is None:
        return None, None, llamacpp_tools.missing_line()
    if prof.draft is None or not prof.draft.has_model:
        return None, None, f"profile {prof.name!r} has no draft model."
    for role, spec in (("target", prof.target), ("draft", prof.draft)):
        if not is_gguf(spec):
            return None, None, (f"it runs GGUF files, and profile {prof.name!r}'s {role} "
                                f"{spec.model!r} is not one.")
    base = prof.path.parent if prof.path else None
    return gguf_file(prof.target, "target", base), gguf_file(prof.draft, "draft", base), None
