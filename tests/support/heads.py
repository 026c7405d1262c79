"""Heads for the tiny targets of the tests: built from the target's shapes and fitted briefly
to it (so that drafts are accepted part of the time), and saved in each reference layout."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from specgen.heads.modules import Eagle3Head, HeadConfig
from specgen.heads.train import eagle_loss, medusa_loss, new_head, soft_cross_entropy

from .tiny import sharpen, tiny_model

LAYERS = 8  # EAGLE-3 fuses three distinct layers (2, L // 2, L - 3): L >= 7


def eagle3_head(target, draft_vocab: int | None = None, seed: int = 0) -> Eagle3Head:
    """An EAGLE-3 head whose draft vocabulary is every other target id (d2t offsets), or the
    whole vocabulary."""
    c = target.config
    vocab = c.vocab_size
    rows = draft_vocab or vocab
    torch.manual_seed(seed)
    layers = c.num_hidden_layers
    head = Eagle3Head(HeadConfig(
        kind="eagle3", hidden=c.hidden_size, vocab=vocab, heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads, head_dim=c.hidden_size // c.num_attention_heads,
        intermediate=c.intermediate_size, rms_eps=c.rms_norm_eps, draft_vocab=rows,
        aux_layers=(2, layers // 2, layers - 3), max_positions=c.max_position_embeddings))
    used = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:rows].sort().values
    head.d2t.copy_(used - torch.arange(rows))
    return head


def _sequences(vocab: int, seed: int, n: int = 16, t: int = 24) -> torch.Tensor:
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


def fit(head, target, steps: int = 60, seed: int = 0, lr: float = 3e-3):
    """Fit `head` to `target` on random sequences (a few seconds), then freeze it."""
    vocab = target.config.vocab_size
    rows = target.get_output_embeddings().weight.detach()
    embed = target.get_input_embeddings()
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    layers = getattr(head.config, "aux_layers", ())
    for step in range(steps):
        ids = _sequences(vocab, seed + step)
        with torch.no_grad():
            out = target.base_model(input_ids=ids, output_hidden_states=True)
        feats = out.last_hidden_state
        if head.kind == "eagle":
            loss, _ = eagle_loss(head, feats, ids, embed, rows, depth=2, generator=gen)
        elif head.kind == "medusa":
            loss, _ = medusa_loss(head, feats, rows)
        else:  # EAGLE-3: the target's next-token distribution over the draft vocabulary
            fused = torch.cat([out.hidden_states[i] for i in layers], -1)[:, :-1]
            embeds = embed(ids[:, 1:])
            _, logits = head(fused, embeds, torch.arange(ids.shape[1] - 1))
            target_logits = F.linear(feats[:, 1:], rows)[..., head.target_ids(
                torch.arange(head.config.draft_vocab))]
            loss = soft_cross_entropy(logits, target_logits)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval().requires_grad_(False)


@functools.lru_cache(maxsize=None)
def fitted(kind: str, family: str = "llama", vocab: int = 64, draft_vocab: int | None = None,
           layers: int = LAYERS, hidden: int = 64, scale: float = 4.0):
    """(target, head), cached per process: do not modify them."""
    target = tiny_model(family, vocab=vocab, hidden=hidden, layers=layers, seed=3)
    sharpen(target, scale)
    target.requires_grad_(False)
    if kind == "eagle3":
        head = eagle3_head(target, draft_vocab)
    else:
        head = new_head(kind, target, intermediate=2 * hidden, medusa_heads=4)
    return target, fit(head, target)


# --- saving in the reference layouts --------------------------------------------------------

def reference_state(head) -> dict[str, torch.Tensor]:
    """The head's tensors under the reference checkpoint's key names."""
    state = {k: v.detach().clone() for k, v in head.state_dict().items()}
    if head.kind == "eagle3":  # the reference file also carries t2d
        t2d = torch.zeros(head.config.vocab, dtype=torch.bool)
        t2d[head.target_ids(torch.arange(head.config.draft_vocab))] = True
        state["t2d"] = t2d
    return state


def reference_config(head, target) -> dict:
    """The config.json the reference implementation publishes beside `head`'s weights."""
    c, t = head.config, target.config
    if head.kind == "medusa":  # as published: the head count understated, no shapes
        return {"medusa_num_heads": 2, "medusa_num_layers": c.medusa_layers,
                "base_model_name_or_path": "tiny"}
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": c.hidden,
              "intermediate_size": c.intermediate, "num_attention_heads": c.heads,
              "num_key_value_heads": c.kv_heads, "num_hidden_layers": 1,
              "rms_norm_eps": c.rms_eps, "vocab_size": t.vocab_size,
              "max_position_embeddings": c.max_positions}
    if head.kind == "eagle":
        config.update(rope_theta=c.rope_theta, bias=c.fc_bias)
    else:
        config["draft_vocab_size"] = c.draft_vocab
    return config


def save_reference(head, target, folder: Path, file: str, state=None, config=None) -> Path:
    """Write `head` as the reference implementation publishes it: `file` is one of
    pytorch_model.bin, model.safetensors, medusa_lm_head.pt, medusa_lm_head.safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    state = reference_state(head) if state is None else state
    if file.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / file))
    else:
        torch.save(state, folder / file)
    config = reference_config(head, target) if config is None else config
    (folder / "config.json").write_text(json.dumps(config))
    return folder
