"""Which sub-layers the self drafter skips (method "self", and "hybrid" without a draft
model): the profile's pinned `skip_layers`, else the set `specgen tune` stored for this
target, else the default (core.drafters.default_skip), said once per target.

A tuned set is stored as JSON under paths.tuned_dir(), keyed by the target's weights (the
sha256 of a GGUF file, else the weight files' paths, sizes and times), its quantization and
its device kind: a set tuned for one of these is not the fastest for another."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgen.core.drafters import default_skip, num_layers
from specgen.decoding.lean import Skip
from specgen.errors import ConfigError
from specgen.paths import tuned_dir
from specgen.profiles import Profile, format_skip_layers, parse_skip_layers

if TYPE_CHECKING:
    from specgen.loading.load import LoadedPair

ORIGINS = ("profile", "tuned", "default")


def skip_text(skip: Skip) -> str:
    return format_skip_layers(skip.attention, skip.mlp)


def skip_from_text(text: str) -> Skip:
    attention, mlp = parse_skip_layers(text)
    return Skip(attention, mlp)


def target_key(pair: LoadedPair) -> str:
    """What a tuned set is stored under: the target's weights, quantization and device kind."""
    device = pair.device.split(":")[0]
    ident = f"{pair.target_name}|{pair.target_key}|{pair.quantization}|{device}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def tuned_path(pair: LoadedPair) -> Path:
    return tuned_dir() / f"{target_key(pair)}.json"


def load_tuned(pair: LoadedPair) -> dict[str, Any] | None:
    """The stored tuning of this target ({"skip_layers": ..., figures}), or None (none stored,
    or a file that does not read as one: tuning again replaces it)."""
    try:
        doc = json.loads(tuned_path(pair).read_text(encoding="utf-8"))
        skip_from_text(doc["skip_layers"])
    except (OSError, ValueError, KeyError, TypeError, ConfigError):
        return None
    return doc


def save_tuned(pair: LoadedPair, skip: Skip, **figures: Any) -> Path:
    """Store a tuned set for this target (atomically: a crash never leaves half a file)."""
    path = tuned_path(pair)
    doc = {"skip_layers": skip_text(skip), "target": pair.target_name,
           "quantization": pair.quantization, "dtype": pair.dtype, "device": pair.device,
           "layers": num_layers(pair.target), "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
           **figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class Resolved:
    skip: Skip
    origin: str  # one of ORIGINS
    notice: str | None = None  # a line to show the user (the default, the first time)


def resolve(profile: Profile, pair: LoadedPair) -> Resolved:
    """The skip set the self drafter uses for this profile's target."""
    pinned = profile.speculation.skip_layers
    if pinned is not None:
        return Resolved(skip_from_text(pinned), "profile")
    doc = load_tuned(pair)
    if doc is not None:
        return Resolved(skip_from_text(doc["skip_layers"]), "tuned")
    skip = default_skip(num_layers(pair.target))
    marker = tuned_dir() / f"{target_key(pair)}.default-noted"
    notice = None
    if not marker.exists():
        notice = (f"method \"self\" drafts with the default skip set ({skip_text(skip)}: every "
                  f"other MLP in the middle half) until a tuned one exists for this target; "
                  f"`specgen tune --profile {profile.name}` searches a faster one. (Said once.)")
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:
            pass  # a read-only cache says it again next time, which is all it costs
    return Resolved(skip, "default", notice)
