"""Reading and writing heads in the reference implementations' layouts, checked against the
target they are to draft for. Every refusal is one ModelError line that says what to do.

| kind | weights | config.json fields read |
|---|---|---|
| eagle (SafeAILab/EAGLE cnets1) | pytorch_model.bin or model.safetensors: fc.weight [H, 2H] (+ fc.bias), layers.0.self_attn.{q,k,v,o}_proj.weight (+ q/k/v bias), layers.0.mlp.{gate,up,down}_proj.weight, layers.0.post_attention_layernorm.weight; embed_tokens.weight optional (the target's is used) | num_attention_heads, num_key_value_heads, head_dim, intermediate_size, rms_norm_eps, rope_theta, rope_scaling, vocab_size (hidden_size: only to say which target a head was made for) |
| eagle3 (SafeAILab/EAGLE cnets) | the same files: fc.weight [H, 3Ht], midlayer.self_attn.* (q/k/v read 2H), midlayer.mlp.*, midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight, norm.weight, lm_head.weight [Vd, H], d2t [Vd] (target id = draft id + d2t), t2d [V] optional; embed_tokens.weight needed only when H differs from the target's | the above, draft_vocab_size, target_hidden_size, eagle_aux_hidden_state_layer_ids (top level or in eagle_config) |
| medusa (FasterDecoding/Medusa, Medusa-1) | medusa_lm_head.pt or medusa_lm_head.safetensors: {i}.{l}.linear.weight/bias (ResBlocks), {i}.{n}.weight [V, H] (output layers) | none needed: the head count is read from the keys (published configs understate it) |

The target fixes the head's width and vocabulary; the head's own sizes come from its config.json
where it states them, else from its weights. check_head holds every tensor to the shapes these
imply from the files' headers alone (before the target's weights load), load_head again on the
tensors, then loads them strictly. `.bin` and `.pt` files are read with
`torch.load(weights_only=True)`: tensors only, no code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from specgen.choices import HEAD_KINDS, listing
from specgen.errors import ModelError
from specgen.heads.modules import Eagle3Head, EagleHead, Head, HeadConfig, MedusaHeads

WEIGHT_FILES = {
    "eagle": ("pytorch_model.bin", "model.safetensors"),
    "eagle3": ("pytorch_model.bin", "model.safetensors"),
    "medusa": ("medusa_lm_head.pt", "medusa_lm_head.safetensors"),
}
# What `save_head` writes (the files a reference loader reads too).
SAVED_FILES = {"eagle": "model.safetensors", "eagle3": "model.safetensors",
               "medusa": "medusa_lm_head.safetensors"}
KIND_NAMES = {"eagle": "EAGLE", "eagle3": "EAGLE-3", "medusa": "Medusa"}
VOCAB_SLACK = 0.98  # vocabularies this close are one tokenizer with padded rows (check_pair's rule)
_MEDUSA_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def weights_file(folder: Path, kind: str) -> Path | None:
    return next((folder / f for f in WEIGHT_FILES[kind] if (folder / f).is_file()), None)


def read_state(path: Path, mmap: bool = False) -> dict[str, Tensor]:
    """A state dict from safetensors, or from a torch pickle with tensors only (`mmap`: mapped
    from disk where its format allows, so that only what is touched is read)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError:  # the legacy format cannot be mapped: read it whole
            if not mmap:
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a damaged or foreign file: its reader's own words
        raise ModelError(f"Cannot read the head weights {path}: {e}".splitlines()[0]) from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ModelError(f"{path} is not a state dict of tensors: not a head checkpoint.")
    return state


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(f"Cannot read {path}: {e}") from None
    if not isinstance(config, dict):
        raise ModelError(f"{path} is not a JSON object.")
    return config


def guess_kind(keys: set[str] | list[str]) -> str | None:
    """Which layout a state dict's keys follow (None: none of the three)."""
    keys = set(keys)
    if "fc.weight" in keys and any(k.startswith("midlayer.") for k in keys):
        return "eagle3"
    if "fc.weight" in keys and any(k.startswith("layers.0.") for k in keys):
        return "eagle"
    if "fc.weight" not in keys and any(_MEDUSA_KEY.match(k) for k in keys):
        return "medusa"  # keys of no Medusa head among them: check_tensors names them
    return None


def _locate(folder: Path, kind: str, where: str) -> Path:
    if kind not in HEAD_KINDS:
        raise ModelError(f"Unknown head kind {kind!r}; choose {listing(HEAD_KINDS)}.")
    path = weights_file(folder, kind)
    if path is None:
        others = [k for k in HEAD_KINDS if k != kind and weights_file(folder, k) is not None]
        hint = (f" It holds {WEIGHT_FILES[others[0]][0]}-style files: is it a "
                f"{KIND_NAMES[others[0]]} head (kind = \"{others[0]}\")?") if others else ""
        raise ModelError(f"{where} holds no {KIND_NAMES[kind]} head weights (looked for "
                         f"{' or '.join(WEIGHT_FILES[kind])}).{hint}")
    return path


def read_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape without reading the weights: the safetensors header, or a torch
    file mapped from disk (read whole only in the legacy format, which cannot be mapped)."""
    if path.suffix != ".safetensors":
        return {k: tuple(v.shape) for k, v in read_state(path, mmap=True).items()}
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # a damaged or foreign file: its reader's own words
        raise ModelError(f"Cannot read the head weights {path}: {e}".splitlines()[0]) from None


def check_head(folder: Path, kind: str, target_config, where: str | None = None,
               target: str = "this target") -> HeadConfig:
    """Check the head in `folder` against the target's config from its files' headers alone,
    before any weights load: every tensor the head needs, none it does not, each of the shape
    the target (`target`, for messages) implies. Returns the head's config."""
    where = where or str(folder)
    path = _locate(folder, kind, where)
    return _checked_config(kind, read_config(folder), read_shapes(path), target_config, where,
                           target)


def load_head(folder: Path, kind: str, target_config, where: str | None = None,
              target: str = "this target") -> Head:
    """The head in `folder`, in the reference layout of `kind`, checked tensor by tensor
    against the target's config (its text config: hidden_size, vocab_size, num_hidden_layers)
    and loaded strictly. fp32, on the CPU: the caller moves it to the target's device and dtype."""
    where = where or str(folder)
    path = _locate(folder, kind, where)
    state = read_state(path)
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    config = _checked_config(kind, read_config(folder), shapes, target_config, where, target)
    if kind == "eagle3":
        _check_d2t(state, config, where)
    head = build_head(config)
    state = _module_state(kind, state, config)
    own = head.state_dict()
    head.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)
    return head.eval().requires_grad_(False)


def build_head(config: HeadConfig) -> Head:
    return {"eagle": EagleHead, "eagle3": Eagle3Head, "medusa": MedusaHeads}[config.kind](config)


def _checked_config(kind: str, raw: dict[str, Any], shapes: dict[str, tuple[int, ...]],
                    target_config, where: str, target: str) -> HeadConfig:
    layout = guess_kind(shapes)
    if layout != kind:
        found = (f"its keys are a {KIND_NAMES[layout]} head's: set kind = \"{layout}\""
                 if layout else f"its keys ({', '.join(sorted(shapes)[:3])}, ...) are none of "
                 f"{listing([KIND_NAMES[k] for k in HEAD_KINDS])}'s")
        raise ModelError(f"{where} is not a {KIND_NAMES[kind]} head: {found}.")
    config = head_config(kind, raw, shapes, target_config, where)
    check_tensors(config, shapes, _made_for(kind, raw, shapes), target_config.hidden_size,
                  where, target)
    return config


def _made_for(kind: str, raw: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> int | None:
    """The hidden size of the target the head was trained for, as its files say it."""
    if kind == "medusa":
        outputs = [s for k, s in shapes.items() if k.startswith("0.") and k.endswith(".weight")
                   and "linear" not in k]
        return outputs[0][-1] if outputs and len(outputs[0]) == 2 else None
    if kind == "eagle3" and isinstance(raw.get("target_hidden_size"), int):
        return raw["target_hidden_size"]
    fc = shapes.get("fc.weight", ())
    return fc[0] if len(fc) == 2 else raw.get("hidden_size")


def expected_shapes(config: HeadConfig, shapes: dict[str, tuple[int, ...]]
                    ) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor a checkpoint of this head holds: the module's own (built on
    the meta device: no memory), and the file's extras, which the target fixes too: a copy of
    its embedding [V, H] (V within VOCAB_SLACK, checked by head_config), EAGLE-3's t2d [V];
    an EAGLE-3 head over the whole vocabulary may omit d2t (draft ids are target ids)."""
    with torch.device("meta"):
        module = build_head(config)
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    if "embed_tokens.weight" in shapes and "embed_tokens.weight" not in expected:
        expected["embed_tokens.weight"] = (_dim(shapes, "embed_tokens.weight", 0) or config.vocab,
                                          config.hidden)
    if config.kind == "eagle3":
        if "t2d" in shapes:
            expected["t2d"] = (_dim(shapes, "t2d", 0) or config.vocab,)
        if "d2t" not in shapes and config.draft_vocab >= config.vocab:
            del expected["d2t"]
    return expected


def check_tensors(config: HeadConfig, shapes: dict[str, tuple[int, ...]], made_for: int | None,
                  target_hidden: int, where: str, target: str) -> None:
    """Every tensor of the file against the shape the target implies: one line naming the
    first that is missing, unexpected or of another shape."""
    expected = expected_shapes(config, shapes)
    name = KIND_NAMES[config.kind]
    wrong = [k for k in expected if k in shapes and tuple(shapes[k]) != expected[k]]
    missing = [k for k in expected if k not in shapes]
    extra = sorted(k for k in shapes if k not in expected)
    other_target = made_for is not None and made_for != target_hidden
    if wrong and (other_target or not (missing or extra)):  # the cause first, where it is known
        key = wrong[0]
        why = (f"this head was trained for a target of hidden size {made_for}; the profile's "
               f"target has {target_hidden}: use a head made for {target}." if other_target else
               "its config.json and its weights disagree, or it belongs to another model: "
               f"download it again, or use a head made for {target}.")
        raise ModelError(f"{where}: {key} has shape {list(shapes[key])}, but on this target it "
                         f"must be {list(expected[key])}: {why}")
    more = len(missing) + len(extra) - 1
    more = f" (and {more} more)" if more > 0 else ""
    if missing:
        key = missing[0]
        raise ModelError(f"{where} lacks {key} (shape {list(expected[key])} for this target)"
                         f"{more}: the checkpoint is incomplete. Download it again, or use a "
                         f"complete {name} head made for {target}.")
    if extra:
        key = extra[0]
        raise ModelError(f"{where} has {key} (shape {list(shapes[key])}), which a {name} head "
                         f"does not have{more}: it is not the {name} layout this version reads. "
                         f"Use a {name} head in the reference layout, made for {target}.")


def _vocab_check(size: int, target_vocab: int, what: str, where: str) -> None:
    if min(size, target_vocab) / max(size, target_vocab) < VOCAB_SLACK:
        raise ModelError(f"{where} was made for a vocabulary of {size:,} tokens ({what}), but "
                         f"the target's has {target_vocab:,}: the head belongs to another model "
                         "family. Pick the head published for this target.")


def _dim(shapes: dict[str, tuple[int, ...]], key: str, i: int) -> int | None:
    """A tensor's size along `i`; None where the file lacks it (check_tensors names it)."""
    shape = shapes.get(key, ())
    return shape[i] if len(shape) > i else None


def _int(raw: dict[str, Any], key: str, default: int | None, where: str) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelError(f"{where}: config.json needs {key} (a positive integer), got {value!r}.")
    return value


def aux_layers(raw: dict[str, Any], n_layers: int, where: str) -> tuple[int, ...]:
    """The target layers whose inputs an EAGLE-3 head fuses: the config's
    eagle_aux_hidden_state_layer_ids, else EAGLE's (2, L // 2, L - 3)."""
    nested = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
    ids = raw.get("eagle_aux_hidden_state_layer_ids", nested.get("eagle_aux_hidden_state_layer_ids"))
    if ids is None:
        ids = [2, n_layers // 2, n_layers - 3]
    if (not isinstance(ids, list) or len(ids) != 3 or len(set(ids)) != 3
            or not all(isinstance(i, int) and 0 <= i < n_layers for i in ids)):
        raise ModelError(f"{where}: an EAGLE-3 head fuses the inputs of three distinct target "
                         f"layers, but with a {n_layers}-layer target they would be {ids}. It "
                         "needs a target of 7 layers or more (or eagle_aux_hidden_state_layer_ids "
                         "in its config.json).")
    return tuple(sorted(ids))


def head_config(kind: str, raw: dict[str, Any], shapes: dict[str, tuple[int, ...]],
                target_config, where: str) -> HeadConfig:
    """The head's config for this target: the target's hidden size and vocabulary; the head's
    own sizes (attention heads, MLP width, draft vocabulary) from its config.json where it
    states them, else from its weights. check_tensors then holds every tensor to it."""
    t_hidden, t_vocab = target_config.hidden_size, target_config.vocab_size
    eps = float(raw.get("rms_norm_eps", 1e-6))
    for key in ("embed_tokens.weight", "t2d"):  # copies of the target's vocabulary
        if key in shapes and shapes[key]:
            _vocab_check(shapes[key][0], t_vocab, f"the rows of its {key}", where)
    if kind == "medusa":
        return _medusa_config(raw, shapes, t_hidden, t_vocab, eps, where)
    prefix = "layers.0." if kind == "eagle" else "midlayer."
    hidden = t_hidden  # an EAGLE-3 head with target_hidden_size may be narrower
    if kind == "eagle3" and "target_hidden_size" in raw:
        hidden = _int(raw, "hidden_size", _dim(shapes, "fc.weight", 0), where)
    heads = _int(raw, "num_attention_heads", None, where)
    kv_heads = _int(raw, "num_key_value_heads", heads, where)
    if "head_dim" not in raw and hidden % heads:
        raise ModelError(f"{where}: config.json's num_attention_heads = {heads} does not divide "
                         f"the hidden size {hidden}, and it states no head_dim. The head does "
                         "not fit this target: use a head made for it.")
    head_dim = _int(raw, "head_dim", hidden // heads, where)
    intermediate = _int(raw, "intermediate_size", _dim(shapes, prefix + "mlp.gate_proj.weight", 0)
                        or _dim(shapes, prefix + "mlp.down_proj.weight", 1), where)
    params = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    scaling = raw.get("rope_scaling") if isinstance(raw.get("rope_scaling"), dict) else (
        params if params.get("rope_type", "default") != "default" else None)
    theta = raw.get("rope_theta", params.get("rope_theta", 10000.0))
    max_positions = int(raw.get("max_position_embeddings", 2048))
    if scaling and "original_max_position_embeddings" in scaling:
        max_positions = max(max_positions, int(scaling["original_max_position_embeddings"]))
    _vocab_check(int(raw.get("vocab_size", t_vocab)), t_vocab, "its vocab_size", where)
    common = dict(hidden=hidden, vocab=t_vocab, heads=heads, kv_heads=kv_heads,
                  head_dim=head_dim, intermediate=intermediate, rms_eps=eps,
                  rope_theta=float(theta), rope_scaling=scaling, max_positions=max_positions,
                  fc_bias="fc.bias" in shapes, qkv_bias=prefix + "self_attn.q_proj.bias" in shapes,
                  extra=raw)
    if kind == "eagle":
        return HeadConfig(kind="eagle", **common)
    rows = _int(raw, "draft_vocab_size",
                _dim(shapes, "lm_head.weight", 0) or _dim(shapes, "d2t", 0), where)
    if "d2t" not in shapes and rows < t_vocab:
        raise ModelError(f"{where} drafts over {rows:,} of {t_vocab:,} tokens but has no d2t "
                         "map (draft id -> target id): the checkpoint is incomplete. "
                         "Download it again, or pick one that carries d2t.")
    own = hidden != t_hidden
    if own and "embed_tokens.weight" not in shapes:
        raise ModelError(f"{where}: the head's hidden size ({hidden}) differs from the target's "
                         f"({t_hidden}), so it needs its own embed_tokens.weight, which the file "
                         "lacks. Download the checkpoint again.")
    n_layers = getattr(target_config, "num_hidden_layers", 0)
    return HeadConfig(kind="eagle3", target_hidden=t_hidden, draft_vocab=rows,
                      aux_layers=aux_layers(raw, n_layers, where), own_embedding=own,
                      embed_rows=_dim(shapes, "embed_tokens.weight", 0) or 0, **common)


def _medusa_config(raw: dict[str, Any], shapes: dict[str, tuple[int, ...]], t_hidden: int,
                   t_vocab: int, eps: float, where: str) -> HeadConfig:
    index: dict[int, set[int]] = {}
    for key in shapes:
        m = _MEDUSA_KEY.match(key)
        if m:  # other keys: check_tensors names them
            index.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    heads = len(index)
    if sorted(index) != list(range(heads)):
        raise ModelError(f"{where}: Medusa heads are numbered {sorted(index)}; expected 0.."
                         f"{heads - 1}. The checkpoint is incomplete.")
    layers = max(index[0])  # the output layer sits after the ResBlocks
    for i in range(heads):
        if index[i] != set(range(layers + 1)):
            raise ModelError(f"{where}: Medusa head {i} has blocks {sorted(index[i])}, head 0 "
                             f"has {sorted(index[0])}: the checkpoint is inconsistent.")
    rows = _dim(shapes, f"0.{layers}.weight", 0) or t_vocab
    declared = raw.get("draft_vocab_size")  # specgen's own heads draft over the first N ids
    if declared is not None and declared == rows and rows <= t_vocab:
        _vocab_check(int(raw.get("vocab_size", t_vocab)), t_vocab, "its vocab_size", where)
    else:
        _vocab_check(rows, t_vocab, "its output layers' rows", where)
    return HeadConfig(kind="medusa", hidden=t_hidden, vocab=t_vocab, rms_eps=eps,
                      draft_vocab=rows, medusa_heads=heads, medusa_layers=layers, extra=raw)


def _check_d2t(state: dict[str, Tensor], config: HeadConfig, where: str) -> None:
    """d2t's values (its shape is check_tensors'): every draft id maps into the target's."""
    if "d2t" not in state or not config.draft_vocab:
        return
    mapped = torch.arange(config.draft_vocab) + state["d2t"].long()
    if int(mapped.min()) < 0 or int(mapped.max()) >= config.vocab:
        raise ModelError(f"{where}: d2t maps draft ids to target ids outside 0.."
                         f"{config.vocab - 1}: the head belongs to another vocabulary.")


def _module_state(kind: str, state: dict[str, Tensor], config: HeadConfig) -> dict[str, Tensor]:
    """The file's tensors as the module's state dict: the target's own embedding replaces a
    copy in the file (EAGLE loads it from the target too), t2d is implied by d2t, a missing
    d2t (the whole vocabulary) is all zeros."""
    state = dict(state)
    if not config.own_embedding:
        state.pop("embed_tokens.weight", None)
    state.pop("t2d", None)
    if kind == "eagle3":
        state["d2t"] = state["d2t"].long() if "d2t" in state else torch.zeros(
            config.draft_vocab, dtype=torch.long)
    return state


def save_head(head: Head, folder: Path, config: dict[str, Any]) -> None:
    """Write `head` in its reference layout (safetensors) with `config` as config.json,
    atomically (a temporary file renamed), so a reader never sees half a checkpoint."""
    import os
    import tempfile

    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()
             if not k.startswith("rotary.")}
    for name, write in ((SAVED_FILES[head.kind], lambda p: save_file(state, p)),
                        ("config.json", lambda p: Path(p).write_text(json.dumps(config, indent=1)))):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
        os.close(fd)
        try:
            write(tmp)
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep other users from loading it
            os.replace(tmp, folder / name)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
