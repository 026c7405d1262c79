"""Fitting a head to a target: teacher-force the target over token chunks of a corpus, keep
its final hidden states (after the last norm), and fit the head to what the target itself
does next.

- EAGLE (EAGLE-1's objective, SafeAILab/EAGLE train/main.py): from the pair (f_t, token_{t+1})
  predict f_{t+1}: SmoothL1 on the feature plus 0.1 x the cross-entropy of the target's own
  next-token distribution softmax(lm_head(f_{t+1})) under lm_head(prediction), with uniform
  noise on the input features. Trained `depth` steps deep: step d reads the head's own
  prediction of step d-1 where drafting will (EAGLE-3's training-time test), attending to the
  true pairs before it and its own chain, as the draft cache holds them when drafting.
- Medusa: head i's logits at t against the target's distribution at t + 2 + i (the target
  stays frozen; soft labels instead of the corpus tokens).

Cross-entropies run over the first `rows` token ids (byte-level BPE ids rank by frequency;
drafting can use the same cut, speculation.draft_vocab), which keeps the output layer, the
dearest part, small. The loop (`Trainer`) interleaves reading new chunks with training
steps, evaluates top-1 agreement with the target on held-out chunks, and checkpoints
everything (features on disk, head, optimizer, counters) so that a later run resumes.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from specgen.errors import ConfigError
from specgen.heads.layout import save_head
from specgen.heads.modules import EagleHead, HeadConfig, MedusaHeads, rotate

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst")


# --- the corpus -----------------------------------------------------------------------------

def default_corpus() -> Path:
    """Text every machine that runs specgen has: the Python installation's standard library
    (its sources and their docstrings)."""
    import sysconfig

    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(folder: Path, seed: int = 0) -> list[Path]:
    """The text files under `folder` (sources and docs; tests and vendored copies of other
    projects left out of the default), in a fixed shuffled order."""
    if not folder.is_dir():
        raise ConfigError(f"--corpus {folder} is not a folder. Give a folder of text files.")
    skip = ("site-packages", "dist-packages", "__pycache__", "/test/", "/tests/", "idle_test")
    files = sorted(p for p in folder.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()
                   and not any(s in f"{p.as_posix()}/" for s in skip)
                   and 200 <= p.stat().st_size <= 400_000)
    if not files:
        raise ConfigError(f"{folder} holds no text files ({', '.join(TEXT_SUFFIXES)}) of "
                          "200 bytes to 400 kB. Give a folder with some.")
    random.Random(seed).shuffle(files)
    return files


def chunks(files: Iterable[Path], encode: Callable[[Path, str], tuple[list[int], list[int]]],
           seq_len: int) -> Iterator[list[int]]:
    """Token chunks of exactly `seq_len` ids. `encode` gives a file's (frame, body) ids: each
    chunk is the frame (e.g. a chat template's prompt, so the head also learns how answers
    start) followed by the next piece of the body; a file's short tail is dropped."""
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        frame, body = encode(path, text)
        room = seq_len - len(frame)
        if room < seq_len // 2:
            raise ConfigError(f"Chunks of {seq_len} tokens leave too little room after the "
                              f"{len(frame)}-token prompt frame: use longer chunks.")
        for i in range(0, len(body) - room + 1, room):
            yield frame + body[i : i + room]


# --- a new head -----------------------------------------------------------------------------

def new_head(kind: str, target, intermediate: int | None = None, rows: int | None = None,
             medusa_heads: int = 4, seed: int = 0) -> EagleHead | MedusaHeads:
    """A fresh head for `target` (a transformers causal LM): an EAGLE head with one decoder
    layer shaped as the target's but for its MLP, `intermediate` wide (default half the
    target's: less to draft through, and room enough for what a local run can read), or Medusa
    heads whose output layers start as the target's first `rows` output rows."""
    config = target.config.get_text_config()
    hidden, vocab = config.hidden_size, config.vocab_size
    heads = config.num_attention_heads
    torch.manual_seed(seed)
    if kind == "medusa":
        rows = min(rows or vocab, vocab)
        head = MedusaHeads(HeadConfig(kind="medusa", hidden=hidden, vocab=vocab,
                                      draft_vocab=rows, medusa_heads=medusa_heads,
                                      medusa_layers=1, rms_eps=config.rms_norm_eps))
        with torch.no_grad():
            out = target.get_output_embeddings().weight[:rows].float()
            for sequential in head:
                sequential[-1].weight.copy_(out)
        return head
    if kind != "eagle":
        raise ConfigError(f"specgen trains eagle and medusa heads, not {kind!r}.")
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return EagleHead(HeadConfig(
        kind="eagle", hidden=hidden, vocab=vocab, heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", heads),
        head_dim=getattr(config, "head_dim", None) or hidden // heads,
        intermediate=intermediate or config.intermediate_size // 2, rms_eps=config.rms_norm_eps,
        rope_theta=float(theta), max_positions=config.max_position_embeddings,
        fc_bias=True, qkv_bias=bool(getattr(config, "attention_bias", False))
        or config.model_type == "qwen2"))


def head_config_json(head: EagleHead | MedusaHeads, target, extra: dict) -> dict:
    """config.json in the reference layout's fields (what SafeAILab/EAGLE's EConfig and
    FasterDecoding/Medusa's MedusaConfig read), plus specgen's own under "specgen"."""
    c = head.config
    t = target.config.get_text_config()
    if c.kind == "medusa":
        return {"medusa_num_heads": c.medusa_heads, "medusa_num_layers": c.medusa_layers,
                "base_model_name_or_path": extra.get("target", ""), "vocab_size": c.vocab,
                "hidden_size": c.hidden, "draft_vocab_size": c.draft_vocab, "specgen": extra}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": c.hidden, "intermediate_size": c.intermediate,
            "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads,
            "num_hidden_layers": 1, "rms_norm_eps": c.rms_eps, "rope_theta": c.rope_theta,
            "max_position_embeddings": c.max_positions, "vocab_size": c.vocab,
            "bias": c.fc_bias, "qkv_bias": c.qkv_bias, "hidden_act": "silu",
            "torch_dtype": "float32", "tie_word_embeddings": False,
            "bos_token_id": getattr(t, "bos_token_id", None),
            "eos_token_id": getattr(t, "eos_token_id", None), "specgen": extra}


# --- the math -------------------------------------------------------------------------------

@torch.no_grad()
def target_features(target, ids: Tensor) -> Tensor:
    """The target's final hidden states (after its last norm) over `ids` [B, T]: [B, T, H]."""
    return target.base_model(input_ids=ids, use_cache=False).last_hidden_state


def soft_cross_entropy(logits: Tensor, target_logits: Tensor) -> Tensor:
    """Mean over rows of -sum p log q, p = softmax(target_logits), q = softmax(logits)."""
    p = target_logits.float().softmax(-1)
    return -(p * logits.float().log_softmax(-1)).sum(-1).mean()


def _chain_mask(t: int, depth: int, device) -> Tensor:
    """Attention mask of step `depth` (1-based) of an unrolled EAGLE draft, over the keys of
    steps 1..depth side by side ([t, depth * t]): the draft pair at position p of step d sits
    where drafting puts it, after the true pairs up to p - d (step 1's keys) and its own chain
    of steps 2..d (one key each, at positions p - d + 2 .. p)."""
    p = torch.arange(t, device=device)
    blocks = [p[None, :] <= (p[:, None] - depth + 1)]  # step 1: true pairs before the chain
    for s in range(2, depth + 1):  # step s's key of this chain: position p - depth + s
        blocks.append(p[None, :] == (p[:, None] - depth + s))
    return torch.cat(blocks, dim=1)


def eagle_unrolled(head: EagleHead, feats: Tensor, embeds: Tensor, depth: int,
                   noise: float = 0.0, generator: torch.Generator | None = None) -> list[Tensor]:
    """The head's predictions over pairs (feats[:, t], embeds[:, t]) for `depth` steps:
    step 1 reads the true features, step d > 1 its own step d - 1 prediction of the position
    before. [B, T, H] per step; step d's row p predicts f_{p+1} (valid for p >= d - 1)."""
    if noise:
        feats = feats + (torch.rand(feats.shape, generator=generator, device=feats.device)
                         - 0.5) * noise
    layer = head.layers[0]
    attn = layer.self_attn
    b, t, _ = feats.shape
    positions = torch.arange(t, device=feats.device)
    cos, sin = head.rotary(feats, positions)
    cos, sin = cos[:, None], sin[:, None]
    keys, values, outs = [], [], []
    x_in = feats
    for d in range(1, depth + 1):
        x = head.fc(torch.cat([embeds, x_in], dim=-1))
        q = attn.q_proj(x).view(b, t, attn.heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, attn.kv_heads, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, attn.kv_heads, attn.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        keys.append(k)
        values.append(v)
        if d == 1:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            mask = _chain_mask(t, d, feats.device)
            a = F.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(values, 2),
                                               attn_mask=mask, enable_gqa=True)
        x = x + attn.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        out = x + layer.mlp(layer.post_attention_layernorm(x))
        outs.append(out)
        # The next step reads this prediction one position on: its pair (f^_{p+1}, t_{p+2}).
        x_in = torch.cat([out[:, :1] * 0, out[:, :-1]], dim=1)
    return outs


def eagle_loss(head: EagleHead, feats: Tensor, ids: Tensor, embed: torch.nn.Module,
               rows: Tensor, depth: int = 1, noise: float = 0.0,
               generator: torch.Generator | None = None, p_weight: float = 0.1,
               decay: float = 0.8, ce_share: float = 1.0) -> tuple[Tensor, dict]:
    """EAGLE-1's loss over chunks ids [B, T] with the target's features [B, T, H]; `rows`
    [R, H] the output rows the cross-entropy runs over. Steps weighted decay**(d-1). The
    cross-entropy (the output layer: most of the cost) reads a random `ce_share` of the
    positions; the feature loss reads them all."""
    embeds = embed(ids[:, 1:]).to(feats.dtype)
    inputs, targets = feats[:, :-1], feats[:, 1:]
    t = targets.shape[1]
    picked = torch.arange(t)
    if ce_share < 1.0:
        picked = torch.randperm(t, generator=generator)[: max(1, int(t * ce_share))].sort().values
    target_logits = F.linear(targets[:, picked], rows)
    total, parts = 0.0, {}
    for d, pred in enumerate(eagle_unrolled(head, inputs, embeds, depth, noise, generator), 1):
        keep = picked >= d - 1  # step d's rows before d - 1 have no chain
        v = F.smooth_l1_loss(pred[:, d - 1 :].float(), targets[:, d - 1 :].float())
        p = soft_cross_entropy(F.linear(pred[:, picked[keep]], rows), target_logits[:, keep])
        total = total + decay ** (d - 1) * (v + p_weight * p)
        parts[f"v{d}"], parts[f"p{d}"] = float(v.detach()), float(p.detach())
    return total, parts


def medusa_loss(head: MedusaHeads, feats: Tensor, rows: Tensor) -> tuple[Tensor, dict]:
    """Head i at position t against the target's distribution of token t + 2 + i, which is
    softmax(lm_head(f_{t+1+i})) over the same rows."""
    target_logits = F.linear(feats, rows)
    total, parts = 0.0, {}
    for i, sequential in enumerate(head):
        shift = i + 1
        logits = sequential(feats[:, :-shift])
        loss = soft_cross_entropy(logits, target_logits[:, shift:])
        total = total + loss
        parts[f"h{i}"] = float(loss.detach())
    return total, parts


@torch.no_grad()
def agreement(head, feats: Tensor, ids: Tensor, embed: torch.nn.Module, rows: Tensor,
              depth: int = 1) -> list[float]:
    """Top-1 agreement with the target on chunks (teacher forced): for EAGLE, per unrolled
    step d, how often argmax lm_head(prediction) is the target's own argmax at that position
    (step 1: the first draft token's greedy acceptance); for Medusa, per head. Over `rows`."""
    target_top = F.linear(feats, rows).argmax(-1)  # [B, T]: argmax at t is token t+1's choice
    if isinstance(head, MedusaHeads):
        return [float((s(feats[:, : -(i + 1)]).argmax(-1) == target_top[:, i + 1 :]).float().mean())
                for i, s in enumerate(head)]
    embeds = embed(ids[:, 1:]).to(feats.dtype)
    outs = eagle_unrolled(head, feats[:, :-1], embeds, depth)
    return [float((F.linear(o[:, d:], rows).argmax(-1) == target_top[:, d + 1 :]).float().mean())
            for d, o in enumerate(outs)]


# --- the loop -------------------------------------------------------------------------------

@dataclass
class TrainSettings:
    kind: str
    seq_len: int = 512
    batch: int = 4  # chunks per step
    rows: int = 32768  # output rows the cross-entropy runs over
    intermediate: int | None = None  # the EAGLE layer's MLP width (None: half the target's)
    depth: int = 2  # EAGLE steps trained unrolled
    lr: float = 1e-3  # peak; warm-up, then a cosine down to a tenth over the budget
    ce_share: float = 0.25  # positions the EAGLE cross-entropy reads per step
    bf16: bool = True  # products in bf16 (autocast; float32 weights): faster where the CPU has bf16 units
    noise: float = 0.2
    held_out: int = 8  # chunks never trained on, for the agreement figure
    read_share: float = 0.5  # of the time: reading new chunks (the rest: training on them)
    eval_every: int = 20  # steps
    medusa_heads: int = 4
    seed: int = 0


@dataclass
class TrainState:
    """What a later run resumes from (besides the features on disk and the head)."""

    settings: dict
    chunks_read: int = 0  # chunks taken from the corpus (held-out ones included)
    steps: int = 0
    seconds: float = 0.0  # training time over all runs
    read_seconds: float = 0.0
    train_seconds: float = 0.0
    tokens_read: int = 0
    corpus_done: bool = False
    loss: float | None = None
    agreement: list[float] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)


@dataclass
class Progress:
    """One report to whoever shows the training (cli/heads.py: a Rich progress bar)."""

    seconds: float
    budget: float
    steps: int
    chunks: int
    tokens: int
    loss: float | None
    agreement: list[float]
    corpus_done: bool
    phase: str  # "reading" | "training" | "evaluating" | "saved"


class Trainer:
    """The resumable loop: `out` holds features/ (one safetensors file per chunk: ids and
    bf16 features), state.json, trainer.pt (head and optimizer) and, after every
    evaluation, the head itself in its reference layout."""

    def __init__(self, target, head, chunk_source: Iterator[list[int]], out: Path,
                 settings: TrainSettings, state: TrainState, info: dict) -> None:
        self.target, self.head, self.out = target, head, out
        self.source, self.settings, self.state, self.info = chunk_source, settings, state, info
        self.embed = target.get_input_embeddings()
        self.rows = target.get_output_embeddings().weight[: settings.rows].detach().float()
        self.optimizer = torch.optim.AdamW(head.parameters(), lr=settings.lr, betas=(0.9, 0.95),
                                           weight_decay=0.0)
        self.generator = torch.Generator().manual_seed(settings.seed + state.steps)
        self.rng = random.Random(settings.seed + state.steps)
        (out / "features").mkdir(parents=True, exist_ok=True)

    # --- checkpoints ---

    @staticmethod
    def load_state(out: Path) -> TrainState | None:
        try:
            return TrainState(**json.loads((out / "state.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def restore(self) -> None:
        path = self.out / "trainer.pt"
        if path.is_file():
            saved = torch.load(path, map_location="cpu", weights_only=True)
            try:  # the head this run builds must be the one saved: every tensor, same shapes
                self.head.load_state_dict(saved["head"], strict=True)
            except RuntimeError:
                raise ConfigError(f"{path} holds a head of other shapes than this run builds "
                                  "(another target, or other settings): give another --out."
                                  ) from None
            self.optimizer.load_state_dict(saved["optimizer"])

    def save(self) -> None:
        """Head, optimizer and counters, each written whole then renamed."""
        tmp = self.out / ".trainer.pt.tmp"
        torch.save({"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict()}, tmp)
        os.replace(tmp, self.out / "trainer.pt")
        tmp = self.out / ".state.json.tmp"
        tmp.write_text(json.dumps(asdict(self.state), indent=1))
        os.replace(tmp, self.out / "state.json")
        info = {**self.info, "chunks": self.state.chunks_read - self.settings.held_out,
                "tokens_trained_on": (self.state.chunks_read - self.settings.held_out)
                * self.settings.seq_len, "steps": self.state.steps,
                "training_seconds": round(self.state.seconds),
                "held_out_agreement": self.state.agreement, "rows": self.settings.rows}
        save_head(self.head, self.out, head_config_json(self.head, self.target, info))

    # --- features ---

    def _feature_file(self, i: int) -> Path:
        return self.out / "features" / f"{i:06d}.safetensors"

    def read_chunk(self) -> bool:
        """Teacher-force the target over the next corpus chunk and keep its features."""
        from safetensors.torch import save_file

        ids = next(self.source, None)
        if ids is None:
            self.state.corpus_done = True
            return False
        x = torch.tensor([ids])
        feats = target_features(self.target, x.to(self.target.device))[0]
        path = self._feature_file(self.state.chunks_read)
        save_file({"ids": x[0], "feats": feats.to(torch.bfloat16).cpu().contiguous()},
                  str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)
        self.state.chunks_read += 1
        self.state.tokens_read += len(ids)
        return True

    def _load(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        from safetensors.torch import load_file

        parts = [load_file(str(self._feature_file(i))) for i in indices]
        return (torch.stack([p["ids"] for p in parts]),
                torch.stack([p["feats"] for p in parts]).float())

    # --- steps ---

    def loss(self, ids: Tensor, feats: Tensor) -> tuple[Tensor, dict]:
        s = self.settings
        if isinstance(self.head, MedusaHeads):
            return medusa_loss(self.head, feats, self.rows)
        return eagle_loss(self.head, feats, ids, self.embed, self.rows, s.depth, s.noise,
                          self.generator, ce_share=s.ce_share)

    def train_step(self, progress: float = 0.0) -> None:
        """One step; `progress` is the share of the time budget spent (the schedule's clock)."""
        s = self.settings
        trainable = list(range(s.held_out, self.state.chunks_read))
        batch = self.rng.sample(trainable, min(s.batch, len(trainable)))
        ids, feats = self._load(batch)
        warm = min(1.0, (self.state.steps + 1) / 20)
        cosine = 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress)))
        for group in self.optimizer.param_groups:
            group["lr"] = s.lr * warm * cosine
        self.head.train()
        with torch.autocast(feats.device.type, dtype=torch.bfloat16, enabled=s.bf16):
            loss, _ = self.loss(ids, feats)
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 0.5)
        self.optimizer.step()
        self.head.eval()
        self.state.steps += 1
        value = float(loss.detach())
        self.state.loss = value if self.state.loss is None else 0.9 * self.state.loss + 0.1 * value

    def evaluate(self) -> list[float]:
        held = list(range(min(self.settings.held_out, self.state.chunks_read)))
        if not held:
            return []
        scores = []
        for i in held:  # one chunk at a time: bounded memory
            ids, feats = self._load([i])
            scores.append(agreement(self.head, feats, ids, self.embed, self.rows,
                                    self.settings.depth))
        self.state.agreement = [sum(col) / len(col) for col in zip(*scores)]
        self.state.history.append({"steps": self.state.steps, "seconds": round(self.state.seconds),
                                   "loss": self.state.loss, "agreement": self.state.agreement})
        return self.state.agreement

    def run(self, budget_seconds: float, report: Callable[[Progress], None] | None = None,
            max_steps: int | None = None) -> TrainState:
        """Train until the budget (over all runs) is spent or `max_steps` more steps are done;
        checkpoint at every evaluation and at the end, also when interrupted (Ctrl-C)."""
        s, st = self.settings, self.state
        steps_at_start = st.steps

        def tell(phase: str) -> None:
            if report is not None:
                report(Progress(st.seconds, budget_seconds, st.steps, st.chunks_read,
                                st.tokens_read, st.loss, st.agreement, st.corpus_done, phase))

        try:
            while st.seconds < budget_seconds and (max_steps is None
                                                   or st.steps - steps_at_start < max_steps):
                start = time.perf_counter()
                need_held = st.chunks_read < s.held_out + 1
                reading = not st.corpus_done and (
                    need_held or st.read_seconds <= s.read_share * (st.read_seconds + st.train_seconds))
                if reading:
                    tell("reading")
                    read = self.read_chunk()
                    st.read_seconds += time.perf_counter() - start
                    if not read and st.chunks_read <= s.held_out:
                        raise ConfigError("The corpus is too small: it gave "
                                          f"{st.chunks_read} chunks of {s.seq_len} tokens, and "
                                          f"{s.held_out + 1} are the least. Give a larger --corpus.")
                else:
                    tell("training")
                    self.train_step(st.seconds / budget_seconds)
                    st.train_seconds += time.perf_counter() - start
                if not reading and st.steps % s.eval_every == 0:
                    tell("evaluating")
                    self.evaluate()
                    self.save()
                    tell("saved")
                st.seconds += time.perf_counter() - start  # evaluating and saving count too
        finally:  # also on Ctrl-C: what was learned is kept, and the next run resumes
            if st.steps and (not st.history or st.history[-1]["steps"] != st.steps):
                self.evaluate()
            self.save()
        tell("saved")
        return st


def budget_note(state: TrainState, settings: TrainSettings) -> str:
    """One line on what the training used: time, corpus tokens, steps, agreement."""
    agree = ", ".join(f"{a:.3f}" for a in state.agreement) or "not measured"
    trained = max(0, state.chunks_read - settings.held_out) * settings.seq_len
    return (f"{state.seconds / 60:.1f} min, {trained:,} corpus tokens read, {state.steps} steps; "
            f"held-out top-1 agreement {agree}")
