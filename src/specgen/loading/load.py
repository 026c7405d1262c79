"""Carry out a profile's plan (plan.py: each role resolved once): check the memory fits,
read the tokenizers and check they match, build the cache entries the plan names
(convert.py, through cache.ensure), load each model with its runtime (a GGUF as stored,
llama.cpp, a packed CPU scheme, int4 on a GPU, or transformers' classes) and prepare it for
its role on the CPU (kernels.prepare)."""

from __future__ import annotations

import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specgen.choices import BNB_SCHEMES
from specgen.decoding import llamacpp
from specgen.errors import ModelError
from specgen.kernels import cuda_int4, gguf, prepare
from specgen.loading import mapped, stored, tokenizer_cache
from specgen.loading.convert import convert_gguf, pack
from specgen.loading.memory import check_memory, check_pair, estimate_bytes
from specgen.loading.plan import (HeadPlan, PairPlan, RolePlan, bnb_config, dtype_name, plan_pair,
                                  resolve_role, runtime_of)
from specgen.loading.sources import (ModelFiles, Progress, fetch_weights, load_config, pretrained,
                                     refused_code, say)
from specgen.loading.tokenizer_cache import load_tokenizer
from specgen.profiles import Profile

if TYPE_CHECKING:  # transformers' model code is imported only where a model needs it
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class LoadedPair:
    target: PreTrainedModel
    draft: PreTrainedModel | llamacpp.LlamaCppDraft | None
    tokenizer: PreTrainedTokenizerBase
    target_name: str
    draft_name: str | None
    device: str
    dtype: str
    quantization: str
    draft_quantization: str = "none"
    load_seconds: float = 0.0
    target_key: str = ""  # the target's weights and dtype (what tuned skip sets are kept by)
    head: torch.nn.Module | None = None  # a draft head on the target (heads/)
    head_name: str | None = None


def context_limit(model: PreTrainedModel | llamacpp.LlamaCppDraft) -> int | None:
    """The most positions the model takes (None when its config does not say)."""
    if isinstance(model, llamacpp.LlamaCppDraft):
        return model.limit()
    return model.config.get_text_config().max_position_embeddings


def _device_map(device: str) -> str | dict[str, str]:
    """A multi-GPU "cuda" spreads the model over every GPU (accelerate); else one device."""
    if device == "cuda":
        return "auto" if torch.cuda.device_count() > 1 else {"": "cuda:0"}
    return {"": device}


def weights_folder(plan: RolePlan, progress: Progress | None = None) -> Path:
    """The folder the role's weights load from: its plan's entry, built first if need be (a
    hub model's weights downloaded first), or the model's own folder."""
    build = plan.build
    if build is not None and build.kind == "converted":
        return convert_gguf(build.origin, plan.dtype, plan.spec.trust_remote_code, progress)
    if plan.files.repo is not None:
        fetch_weights(plan.files, progress)
    if build is None:
        return plan.files.path
    return pack(plan.files, build.origin, plan.spec.quantization, plan.dtype,
                plan.spec.trust_remote_code, progress)


def _from_transformers(plan: RolePlan, folder: Path, progress: Progress | None, lean: bool):
    """A model transformers' classes load (float, bitsandbytes, a GGUF's converted copy), or
    with `lean` specgen's own tree where it fits (loading/mapped.py)."""
    spec, role = plan.spec, plan.role
    what = f" in {spec.quantization}" if spec.quantization != "none" else ""
    say(progress, f"Loading {role} {plan.files.name}{what} on {plan.device}")
    files = ModelFiles(plan.files.name, folder)
    if lean:
        model = mapped.load_lean(folder, load_config(files, spec.trust_remote_code, lean), role,
                                 plan.dtype, spec.quantization, plan.device, spec.trust_remote_code)
        if model is not None:
            return model
    kwargs = {"dtype": plan.dtype, "trust_remote_code": spec.trust_remote_code,
              "device_map": _device_map(plan.device)}
    if spec.quantization in BNB_SCHEMES:
        kwargs["quantization_config"] = bnb_config(spec.quantization, plan.dtype)
    return _pretrained(files, **kwargs)


def _pretrained(files: ModelFiles, **kwargs) -> PreTrainedModel:
    try:
        return pretrained(files.path, **kwargs)
    except (OSError, ValueError) as e:
        raise refused_code(files.name, e) or ModelError(f"Cannot load {files.name}: {e}") from None


def _packed(plan: RolePlan, folder: Path, progress: Progress | None, lean: bool):
    """A CPU scheme's model, mapped packed from its cache entry."""
    say(progress, f"Loading {plan.role} {plan.files.name} in {plan.spec.quantization} on cpu")
    return mapped.load_packed(folder, plan.dtype, plan.role == "target", plan.spec.trust_remote_code,
                              plan.spec.quantization if lean else None)


def _streamed_int4(plan: RolePlan, folder: Path, progress: Progress | None, lean: bool):
    """Quantized tensor by tensor, onto one GPU."""
    from specgen.loading import streamed

    gpu = torch.device("cuda:0" if plan.device == "cuda" else plan.device)
    cuda_int4.check_device(gpu, plan.dtype)
    say(progress, f"Loading {plan.role} {plan.files.name} in {plan.spec.quantization} on {gpu}")
    config = load_config(ModelFiles(plan.files.name, folder), plan.spec.trust_remote_code)
    return streamed.load_int4(folder, config, plan.dtype, gpu, plan.spec.trust_remote_code)


LOADERS = {"transformers": _from_transformers, "packed": _packed, "int4-gpu": _streamed_int4}


def load_role(plan: RolePlan, progress: Progress | None = None, lean: bool = False):
    """One planned model loaded with its runtime and prepared for its role on the CPU
    (kernels.prepare). `lean`: the model only ever runs through specgen's decoders, so where
    it fits it is built on specgen's own tree, without transformers' model code."""
    if plan.runtime == "llama.cpp":
        return load_llama_draft(plan, progress)
    if plan.runtime == "stored":  # the file's own blocks, mapped: nothing converted
        if not gguf.compiled():  # its compile is the first run's longest wait
            say(progress, "Compiling specgen's GGUF kernels (once for this version, up to a minute)")
            gguf.library()
        say(progress, f"Mapping {plan.role} {plan.files.name} as stored in {plan.files.gguf}")
        return stored.load_gguf(plan.files.gguf_path, plan.role)
    model = LOADERS[plan.runtime](plan, weights_folder(plan, progress), progress, lean)
    if plan.runtime == "int4-gpu":
        return model
    return prepare(model, plan.role, plan.spec.quantization if plan.runtime == "packed" else "none").eval()


def load_llama_draft(plan: RolePlan, progress: Progress | None = None) -> llamacpp.LlamaCppDraft:
    """The GGUF draft on llama.cpp's CPU kernels, with as many threads as torch uses."""
    say(progress, f"Loading draft {plan.files.name} in llama.cpp on cpu")
    return llamacpp.load_draft(plan.files.gguf_path, torch.get_num_threads())


def load_for_training(profile: Profile, progress: Progress | None = None
                      ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """The profile's target as a plain transformers model in its dtype, unquantized and not
    prepared for decoding (teacher forcing reads whole chunks at once), with its tokenizer
    and name: for `specgen heads train`."""
    spec = dataclasses.replace(profile.target, quantization="none")  # trained on the float weights
    plan = resolve_role("target", spec, progress, profile.path.parent if profile.path else None)
    tokenizer = load_tokenizer(plan.files, spec.trust_remote_code)
    config = load_config(plan.files, spec.trust_remote_code)
    if os.environ.get("SPECGEN_SKIP_MEMORY_CHECK") != "1":
        check_memory([(f"target {plan.files.name}", plan.device,
                       estimate_bytes(config, plan.dtype, "none", spec.trust_remote_code))])
    folder = weights_folder(plan, progress)
    say(progress, f"Loading target {plan.files.name} on {plan.device}")
    model = _pretrained(ModelFiles(plan.files.name, folder), dtype=plan.dtype,
                        trust_remote_code=spec.trust_remote_code, device_map=_device_map(plan.device))
    return model.eval().requires_grad_(False), tokenizer, plan.files.name


def load_head(head: HeadPlan, target: PreTrainedModel, target_name: str,
              progress: Progress | None = None) -> torch.nn.Module:
    """The planned draft head (checked against the target's config when planned), checked
    again tensor by tensor against the loaded target as it is built."""
    from specgen.heads.layout import KIND_NAMES, load_head as read_head

    say(progress, f"Loading the {KIND_NAMES[head.kind]} head {head.name}")
    return read_head(head.folder, head.kind, target.config.get_text_config(), where=head.name,
                     target=target_name)


def load_plan(plan: PairPlan, progress: Progress | None = None) -> LoadedPair:
    """Carry a plan out: check the memory, read the tokenizers, load the models (a llama.cpp
    draft on a thread of its own: its C calls let go of the GIL while the target maps here)
    and the draft head."""
    start = time.perf_counter()
    check_pair(plan)
    target, draft = plan.target, plan.draft
    draft_load = None
    if draft is not None and draft.runtime == "llama.cpp":
        pool = ThreadPoolExecutor(1, thread_name_prefix="specgen-llama-draft")
        draft_load = pool.submit(load_llama_draft, draft, progress)
        pool.shutdown(wait=False)
    tokenizer = tokenizer_cache.load_tokenizers(plan, progress)
    model = load_role(target, progress, plan.lean)
    drafter = None
    if draft is not None:
        drafter = draft_load.result() if draft_load else load_role(draft, progress, plan.lean)
    head = load_head(plan.head, model, target.files.name, progress) if plan.head else None
    head_name = plan.head.name if plan.head else None
    return LoadedPair(
        target=model, draft=drafter, tokenizer=tokenizer, target_name=target.files.name,
        draft_name=draft.files.name if draft else head_name,  # who drafts
        device=target.device, dtype=dtype_name(target.dtype),
        quantization=target.spec.quantization,
        draft_quantization=draft.spec.quantization if draft else "none",
        head=head, head_name=head_name,
        load_seconds=time.perf_counter() - start, target_key=plan.target_key,
    )


def load_pair(profile: Profile, progress: Progress | None = None, lean: bool = False) -> LoadedPair:
    """Locate, check (tokenizers, memory) and load the profile's target and draft (and its
    draft head, where its method drafts with one). `lean`: the models only run through
    specgen's decoders (never transformers' forward or `generate`), so they may be built on
    specgen's own tree (load_role)."""
    return load_plan(plan_pair(profile, progress, lean), progress)


def load_peer(profile: Profile, progress: Progress | None = None) -> PreTrainedModel | None:
    """A llama.cpp draft's transformers copy (as the draft's dtype and quantization say, on
    the CPU), for `specgen bench`'s peer; None where the draft does not run in llama.cpp."""
    spec = profile.draft
    if spec is None or not spec.has_model or runtime_of("draft", spec) != "llama.cpp":
        return None
    spec = dataclasses.replace(spec, runtime="transformers", device="cpu")
    plan = resolve_role("draft", spec, progress, profile.path.parent if profile.path else None)
    return load_role(plan, progress)
