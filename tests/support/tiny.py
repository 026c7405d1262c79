"""Tiny random causal LMs for tests: built in memory, or saved as a local model directory."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

FAMILIES = {"llama": LlamaConfig, "qwen2": Qwen2Config}


def tiny_model(family: str = "llama", *, vocab: int = 64, hidden: int = 32, layers: int = 2,
               seed: int = 0, eos: int | None = None, **overrides):
    """A random fp32 causal LM small enough to run thousands of steps in seconds."""
    config = FAMILIES[family](
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        eos_token_id=eos, bos_token_id=None, pad_token_id=None,
        **{"max_position_embeddings": 512, "tie_word_embeddings": False, **overrides},
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    return model


def sharpen(model, scale: float) -> None:
    """Scale the output head so that the random model's distributions are less flat
    (drafts then agree with the target often enough to exercise acceptance)."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)


def save_tiny(model, path: Path) -> Path:
    """Save `model` as a local model directory at `path` (returned)."""
    model.save_pretrained(path)
    return path


def distill(draft, target, steps: int = 100, seed: int = 0, lr: float = 1e-2) -> None:
    """Train `draft` briefly to imitate `target` (KL on random sequences), so that it agrees
    with the target part of the time, as a real draft does (random pairs almost never agree)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(draft.parameters(), lr=lr)
    vocab = target.config.vocab_size
    for _ in range(steps):
        x = torch.randint(0, vocab, (16, 24), generator=g)
        with torch.no_grad():
            p = target(x).logits.log_softmax(-1)
        q = draft(x).logits.log_softmax(-1)
        loss = torch.nn.functional.kl_div(q, p, log_target=True, reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        opt.step()
    draft.eval().requires_grad_(False)


@functools.lru_cache(maxsize=None)
def tiny_pair(family: str = "llama", vocab: int = 64, seed: int = 0):
    """A target and a distilled draft of smaller depth and width (cached per process:
    do not modify the returned models)."""
    target = tiny_model(family, vocab=vocab, hidden=64, layers=3, seed=seed)
    sharpen(target, 4.0)
    target.requires_grad_(False)
    draft = tiny_model(family, vocab=vocab, hidden=32, layers=1, seed=seed + 1)
    distill(draft, target, seed=seed)
    return target, draft


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer():
    """A byte-level tokenizer with no merges: 256 byte tokens, then <|endoftext|> (256),
    <|im_start|> (257) and <|im_end|> (258, the EOS). Any text round-trips exactly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core)
    tok.add_special_tokens(
        {"eos_token": "<|im_end|>", "additional_special_tokens": ["<|endoftext|>", "<|im_start|>"]}
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def word_tokenizer(vocab: int = 64, eos: str = "t1", shuffle: bool = False):
    """A word-level tokenizer of `vocab` words t0, t1, ... (t0 unknown, t2 BOS, `eos` the EOS);
    `shuffle` swaps the ids of t5 and t6 (a vocabulary that differs from the plain one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = [f"t{i}" for i in range(vocab)]
    if shuffle:
        names[5], names[6] = names[6], names[5]
    tk = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=eos, bos_token="t2", unk_token="t0")


TINY_VOCAB = 259


def write_tiny_pair(root: Path, family: str = "llama", max_positions: int = 512) -> tuple[Path, Path]:
    """Save a tiny target and a distilled draft, each with the tiny tokenizer, as local
    model directories under `root`."""
    target = tiny_model(family, vocab=TINY_VOCAB, hidden=64, layers=3, seed=0, eos=258,
                        max_position_embeddings=max_positions)
    sharpen(target, 4.0)
    draft = tiny_model(family, vocab=TINY_VOCAB, hidden=32, layers=1, seed=1, eos=258,
                       max_position_embeddings=max_positions)
    distill(draft, target, steps=60)
    tok = tiny_tokenizer()
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        paths.append(root / name)
    return paths[0], paths[1]


def write_tiny_profile(root: Path, name: str = "tiny", max_new_tokens: int = 24) -> Path:
    """A profile for the CLI on a tiny fp32 pair saved under `root` (4096 positions, so that
    long generations can be interrupted)."""
    target, draft = write_tiny_pair(root, max_positions=4096)
    profile = root / f"{name}.toml"
    profile.write_text(
        f'description = "tiny fp32 pair for tests"\n'
        f'[target]\nmodel = "{target}"\ndtype = "float32"\ndevice = "cpu"\n'
        f'[draft]\nmodel = "{draft}"\ndtype = "float32"\ndevice = "cpu"\n'
        f"[speculation]\nnum_speculative_tokens = 3\n"
        f"[generation]\nmax_new_tokens = {max_new_tokens}\n"
    )
    return profile


class FakeLlama:
    """What specgen uses of llama_cpp.Llama, over a tiny transformers model, for machines
    without llama-cpp-python (CI). As in llama.cpp, `n_tokens` marks how much of the KV cache
    is valid (the caller may lower it), `eval` first drops the entries past it, and only the
    last position's logits are kept, in a C float buffer read through `llama_get_logits_ith`
    (see `fake_llama_cpp`)."""

    def __init__(self, model, eos: int = 0, n_ctx: int | None = None) -> None:
        from transformers import DynamicCache

        self.model, self.eos = model, eos
        self._n_ctx = n_ctx or model.config.max_position_embeddings
        self.cache = DynamicCache(config=model.config)
        self.n_tokens = 0
        self.ctx = self  # the handle llama_get_logits_ith receives
        self.buffer = np.zeros(model.config.vocab_size, dtype=np.float32)
        self.input_ids = np.zeros(self._n_ctx, dtype=np.intc)  # as Llama's: one slot a position
        self.evals: list[int] = []  # tokens per eval call

    def n_vocab(self) -> int:
        return self.model.config.vocab_size

    def token_eos(self) -> int:
        return self.eos

    def n_ctx(self) -> int:
        return self._n_ctx

    def eval(self, tokens: list[int]) -> None:
        if self.n_tokens + len(tokens) > self._n_ctx:  # Llama fails where its slots end
            raise ValueError(f"{self.n_tokens + len(tokens)} tokens in a context of {self._n_ctx}")
        self.input_ids[self.n_tokens:self.n_tokens + len(tokens)] = tokens
        extra = self.cache.get_seq_length() - self.n_tokens
        if extra > 0:
            self.cache.crop(-extra)
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([tokens]), cache=self.cache, use_cache=True)
        self.buffer[:] = out.logits[0, -1].numpy()
        self.n_tokens += len(tokens)
        self.evals.append(len(tokens))

    def reset(self) -> None:
        self.n_tokens = 0


def fake_llama_cpp():
    """A stand-in for the llama_cpp module: what LlamaCppDraft calls of it."""
    import ctypes
    import importlib.machinery
    import types

    def llama_get_logits_ith(ctx: FakeLlama, i: int):
        assert i == -1  # LlamaCppDraft reads the last position's row only
        return ctx.buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    def llama_model_n_ctx_train(model) -> int:  # FakeLlama.model: the transformers model
        return model.config.max_position_embeddings

    module = types.ModuleType("llama_cpp")
    module.__spec__ = importlib.machinery.ModuleSpec("llama_cpp", None)  # for find_spec
    module.llama_get_logits_ith = llama_get_logits_ith
    module.llama_model_n_ctx_train = llama_model_n_ctx_train
    return module


def write_tiny_gguf(path: Path, vocab: int = 64, hidden: int = 32, layers: int = 2,
                    heads: int = 4, kv: int = 2, ff: int = 64, seed: int = 0,
                    merges: tuple[str, ...] = (), arch: str = "llama", kind: str = "F32",
                    scale: float = 0.1) -> Path:
    """A real llama (or qwen2, with q/k/v biases) GGUF file with a byte-level tokenizer, written
    with gguf's writer; its matrices stored as `kind` (F32, or a block format gguf's writer
    quantizes: Q8_0, Q5_0, Q4_0, ...; norms and biases stay F32). llama.cpp refuses a file
    without merges: give it one (e.g. "a a")."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    w.add_file_type(0)
    tokens = ["<unk>", "<s>", "</s>"] + [chr(97 + i % 26) * (1 + i // 26) for i in range(vocab - 3)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (vocab - 3))
    w.add_token_scores([0.0] * vocab)
    w.add_token_merges(list(merges))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def t(*shape):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def matrix(name: str, *shape):
        if kind == "F32":
            return w.add_tensor(name, t(*shape))
        qtype = gguf.GGMLQuantizationType[kind]
        w.add_tensor(name, gguf.quants.quantize(t(*shape), qtype), raw_dtype=qtype)

    def norm(name: str):
        w.add_tensor(name, np.ones(hidden, np.float32))

    matrix("token_embd.weight", vocab, hidden)
    norm("output_norm.weight")
    matrix("output.weight", vocab, hidden)
    hd = hidden // heads
    for i in range(layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        matrix(p + "attn_q.weight", hidden, hidden)
        matrix(p + "attn_k.weight", kv * hd, hidden)
        matrix(p + "attn_v.weight", kv * hd, hidden)
        if arch == "qwen2":
            for name, n in (("attn_q", hidden), ("attn_k", kv * hd), ("attn_v", kv * hd)):
                w.add_tensor(f"{p}{name}.bias", t(n))
        matrix(p + "attn_output.weight", hidden, hidden)
        norm(p + "ffn_norm.weight")
        matrix(p + "ffn_gate.weight", ff, hidden)
        matrix(p + "ffn_up.weight", ff, hidden)
        matrix(p + "ffn_down.weight", hidden, ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def chat_greedy(model_dir, prompt: str, n: int) -> list[int]:
    """The saved model's own greedy continuation (transformers' `generate`) of `prompt` as
    one user turn of its chat template: what `specgen run` must print, token for token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    text = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                   add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    return model.generate(ids, do_sample=False, max_new_tokens=n)[0, ids.shape[1]:].tolist()
