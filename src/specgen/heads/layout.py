"""Reading and writing heads in the reference implementations' layouts, checked against the
target they are to draft for. Every refusal is one ModelError line that says what to do.

| kind | weights | config.json fields read |
|---|---|---|
| eagle (SafeAILab/EAGLE cnets1) | pytorch_model.bin or model.safetensors: fc.weight [H, 2H] (+ fc.bias), layers.0.self_attn.{q,k,v,o}_proj.weight (+ q/k/v bias), layers.0.mlp.{gate,up,down}_proj.weight, layers.0.post_attention_layernorm.weight; embed_tokens.weight optional (the target's is used) | hidden_size, num_attention_heads, num_key_value_heads, rms_norm_eps, rope_theta, rope_scaling, vocab_size |
| eagle3 (SafeAILab/EAGLE cnets) | the same files: fc.weight [H, 3Ht], midlayer.self_attn.* (q/k/v read 2H), midlayer.mlp.*, midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight, norm.weight, lm_head.weight [Vd, H], d2t [Vd] (target id = draft id + d2t), t2d [V] optional; embed_tokens.weight needed only when H differs from the target's | the above, draft_vocab_size, target_hidden_size, eagle_aux_hidden_state_layer_ids (top level or in eagle_config) |
| medusa (FasterDecoding/Medusa, Medusa-1) | medusa_lm_head.pt or medusa_lm_head.safetensors: {i}.{l}.linear.weight/bias (ResBlocks), {i}.{n}.weight [V, H] (output layers) | none needed: the head count is read from the keys (published configs understate it) |

`.bin` and `.pt` files are read with `torch.load(weights_only=True)`: tensors only, no code.
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


def read_state(path: Path) -> dict[str, Tensor]:
    """A state dict from safetensors, or from a torch pickle with tensors only."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
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
    if keys and all(_MEDUSA_KEY.match(k) for k in keys):
        return "medusa"
    return None


def load_head(folder: Path, kind: str, target_config, where: str | None = None) -> Head:
    """The head in `folder`, in the reference layout of `kind`, checked against the target's
    config (its text config: hidden_size, vocab_size, num_hidden_layers). fp32, on the CPU:
    the caller moves it to the target's device and dtype."""
    where = where or str(folder)
    if kind not in HEAD_KINDS:
        raise ModelError(f"Unknown head kind {kind!r}; choose {listing(HEAD_KINDS)}.")
    path = weights_file(folder, kind)
    if path is None:
        others = [k for k in HEAD_KINDS if k != kind and weights_file(folder, k) is not None]
        hint = (f" It holds {WEIGHT_FILES[others[0]][0]}-style files: is it a "
                f"{KIND_NAMES[others[0]]} head (kind = \"{others[0]}\")?") if others else ""
        raise ModelError(f"{where} holds no {KIND_NAMES[kind]} head weights (looked for "
                         f"{' or '.join(WEIGHT_FILES[kind])}).{hint}")
    state = read_state(path)
    raw = read_config(folder)
    layout = guess_kind(state)
    if layout != kind:
        found = (f"its keys are a {KIND_NAMES[layout]} head's: set kind = \"{layout}\""
                 if layout else f"its keys ({', '.join(sorted(state)[:3])}, ...) are none of "
                 f"{listing([KIND_NAMES[k] for k in HEAD_KINDS])}'s")
        raise ModelError(f"{where} is not a {KIND_NAMES[kind]} head: {found}.")
    config = head_config(kind, raw, state, target_config, where)
    head = {"eagle": EagleHead, "eagle3": Eagle3Head, "medusa": MedusaHeads}[kind](config)
    _load_state(head, _module_state(kind, state, config), where)
    return head.eval().requires_grad_(False)


def _vocab_check(size: int, target_vocab: int, what: str, where: str) -> None:
    if min(size, target_vocab) / max(size, target_vocab) < VOCAB_SLACK:
        raise ModelError(f"{where} was made for a vocabulary of {size:,} tokens ({what}), but "
                         f"the target's has {target_vocab:,}: the head belongs to another model "
                         "family. Pick the head published for this target.")


def _hidden_check(size: int, target_hidden: int, what: str, where: str) -> None:
    if size != target_hidden:
        raise ModelError(f"{where} was made for a target with hidden size {size} ({what}), but "
                         f"this target's is {target_hidden}. Pick the head published for this "
                         "target.")


def _shape(state: dict[str, Tensor], key: str, where: str) -> tuple[int, ...]:
    if key not in state:
        raise ModelError(f"{where} lacks {key}: the checkpoint is incomplete. Download it again.")
    return tuple(state[key].shape)


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


def head_config(kind: str, raw: dict[str, Any], state: dict[str, Tensor], target_config,
                where: str) -> HeadConfig:
    """The head's shapes, from its weights where they say it, else its config.json; checked
    against the target's hidden size, vocabulary and depth."""
    t_hidden, t_vocab = target_config.hidden_size, target_config.vocab_size
    eps = float(raw.get("rms_norm_eps", 1e-6))
    if kind == "medusa":
        return _medusa_config(raw, state, t_hidden, t_vocab, eps, where)
    prefix = "layers.0." if kind == "eagle" else "midlayer."
    fc_out, fc_in = _shape(state, "fc.weight", where)
    q_rows, q_in = _shape(state, prefix + "self_attn.q_proj.weight", where)
    hidden = fc_out
    heads = _int(raw, "num_attention_heads", None, where)
    kv_heads = _int(raw, "num_key_value_heads", heads, where)
    if q_rows % heads:
        raise ModelError(f"{where}: q_proj has {q_rows} rows, not a multiple of "
                         f"num_attention_heads = {heads}. config.json does not fit the weights.")
    head_dim = q_rows // heads
    if _shape(state, prefix + "self_attn.k_proj.weight", where)[0] != kv_heads * head_dim:
        raise ModelError(f"{where}: k_proj does not fit num_key_value_heads = {kv_heads}. "
                         "config.json does not fit the weights.")
    intermediate = _shape(state, prefix + "mlp.gate_proj.weight", where)[0]
    params = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    scaling = raw.get("rope_scaling") if isinstance(raw.get("rope_scaling"), dict) else (
        params if params.get("rope_type", "default") != "default" else None)
    theta = raw.get("rope_theta", params.get("rope_theta", 10000.0))
    max_positions = int(raw.get("max_position_embeddings", 2048))
    if scaling and "original_max_position_embeddings" in scaling:
        max_positions = max(max_positions, int(scaling["original_max_position_embeddings"]))
    common = dict(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                  intermediate=intermediate, rms_eps=eps, rope_theta=float(theta),
                  rope_scaling=scaling, max_positions=max_positions,
                  fc_bias="fc.bias" in state, qkv_bias=prefix + "self_attn.q_proj.bias" in state,
                  extra=raw)
    if kind == "eagle":
        _hidden_check(hidden, t_hidden, "fc.weight", where)
        if fc_in != 2 * hidden or q_in != hidden:
            raise ModelError(f"{where}: fc.weight is {fc_out}x{fc_in}; an EAGLE head's is "
                             f"{hidden}x{2 * hidden}. Is it an EAGLE-3 head (kind = \"eagle3\")?")
        vocab = int(raw.get("vocab_size", t_vocab))
        if "embed_tokens.weight" in state:
            vocab = state["embed_tokens.weight"].shape[0]
        _vocab_check(vocab, t_vocab, "its vocab_size", where)
        return HeadConfig(kind="eagle", vocab=t_vocab, **common)
    # EAGLE-3
    target_hidden = int(raw.get("target_hidden_size") or hidden)
    _hidden_check(target_hidden, t_hidden,
                  "target_hidden_size" if "target_hidden_size" in raw else "hidden_size", where)
    if fc_in != 3 * target_hidden or q_in != 2 * hidden:
        raise ModelError(f"{where}: fc.weight is {fc_out}x{fc_in}; an EAGLE-3 head for this "
                         f"target fuses three {target_hidden}-wide states ({hidden}x"
                         f"{3 * target_hidden}).")
    rows = _shape(state, "lm_head.weight", where)[0]
    vocab = int(raw.get("vocab_size", t_vocab))
    _vocab_check(vocab, t_vocab, "its vocab_size", where)
    if "t2d" in state:
        _vocab_check(state["t2d"].shape[0], t_vocab, "the length of its t2d map", where)
    if "d2t" not in state:
        if rows < vocab:
            raise ModelError(f"{where} drafts over {rows:,} of {vocab:,} tokens but has no d2t "
                             "map (draft id -> target id): the checkpoint is incomplete. "
                             "Download it again, or pick one that carries d2t.")
        state["d2t"] = torch.zeros(rows, dtype=torch.long)  # the same vocabulary: ids as they are
    d2t = state["d2t"].long()
    if tuple(d2t.shape) != (rows,):
        raise ModelError(f"{where}: d2t has shape {list(d2t.shape)}, lm_head.weight has {rows} "
                         "rows: they must match. The checkpoint is damaged.")
    mapped = torch.arange(rows) + d2t
    if rows and (int(mapped.min()) < 0 or int(mapped.max()) >= t_vocab):
        raise ModelError(f"{where}: d2t maps draft ids to target ids outside 0..{t_vocab - 1}: "
                         "the head belongs to another vocabulary.")
    own = hidden != t_hidden
    if own and "embed_tokens.weight" not in state:
        raise ModelError(f"{where}: the head's hidden size ({hidden}) differs from the target's "
                         f"({t_hidden}), so it needs its own embed_tokens.weight, which the file "
                         "lacks. Download the checkpoint again.")
    n_layers = getattr(target_config, "num_hidden_layers", 0)
    return HeadConfig(kind="eagle3", vocab=t_vocab, target_hidden=target_hidden,
                      draft_vocab=rows, aux_layers=aux_layers(raw, n_layers, where),
                      own_embedding=own, **common)


def _medusa_config(raw: dict[str, Any], state: dict[str, Tensor], t_hidden: int, t_vocab: int,
                   eps: float, where: str) -> HeadConfig:
    index: dict[int, set[int]] = {}
    for key in state:
        m = _MEDUSA_KEY.match(key)
        index.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    heads = len(index)
    if sorted(index) != list(range(heads)):
        raise ModelError(f"{where}: Medusa heads are numbered {sorted(index)}; expected 0.."
                         f"{heads - 1}. The checkpoint is incomplete.")
    layers = max(index[0])  # the output layer sits after the ResBlocks
    rows = None
    for i in range(heads):
        if index[i] != set(range(layers + 1)):
            raise ModelError(f"{where}: Medusa head {i} has blocks {sorted(index[i])}, head 0 "
                             f"has {sorted(index[0])}: the checkpoint is inconsistent.")
        out = _shape(state, f"{i}.{layers}.weight", where)
        _hidden_check(out[1], t_hidden, f"head {i}'s output layer", where)
        for block in range(layers):
            _hidden_check(_shape(state, f"{i}.{block}.linear.weight", where)[0], t_hidden,
                          f"head {i}'s block {block}", where)
        rows = out[0]
    declared = raw.get("draft_vocab_size")  # specgen's own heads draft over the first N ids
    if declared is not None and declared == rows and rows <= t_vocab:
        _vocab_check(int(raw.get("vocab_size", t_vocab)), t_vocab, "its vocab_size", where)
    else:
        _vocab_check(rows, t_vocab, "its output layers' rows", where)
    return HeadConfig(kind="medusa", hidden=t_hidden, vocab=t_vocab, rms_eps=eps,
                      draft_vocab=rows, medusa_heads=heads, medusa_layers=layers, extra=raw)


def _module_state(kind: str, state: dict[str, Tensor], config: HeadConfig) -> dict[str, Tensor]:
    """The file's tensors as the module's state dict: the target's own embedding replaces a
    copy in the file (EAGLE loads it from the target too), t2d is implied by d2t."""
    state = dict(state)
    if kind in ("eagle", "eagle3") and not config.own_embedding:
        state.pop("embed_tokens.weight", None)
    state.pop("t2d", None)
    if kind == "eagle3":
        state["d2t"] = state["d2t"].long()
    return state


def _load_state(head: torch.nn.Module, state: dict[str, Tensor], where: str) -> None:
    if getattr(head.config, "own_embedding", False):
        head.embed_tokens = torch.nn.Embedding(*state["embed_tokens.weight"].shape)
    expected = {k for k in head.state_dict() if not k.startswith("rotary.")}
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or extra:
        what = (f"lacks {', '.join(missing[:3])}" if missing else
                f"has unexpected {', '.join(extra[:3])}")
        more = len(missing) + len(extra) - 3
        raise ModelError(f"{where} {what}{f' (and {more} more)' if more > 0 else ''}: not the "
                         f"{KIND_NAMES[head.kind]} layout this version reads.")
    shapes = head.state_dict()
    for key, value in state.items():
        if tuple(value.shape) != tuple(shapes[key].shape):
            raise ModelError(f"{where}: {key} has shape {list(value.shape)}, config.json and the "
                             f"other weights imply {list(shapes[key].shape)}.")
    head.load_state_dict({k: v.to(shapes[k].dtype) for k, v in state.items()}, strict=False)


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
