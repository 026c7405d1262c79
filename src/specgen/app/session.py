"""A loaded profile ready to generate: the model pair, its drafter and generator, and the
prompt encoding (chat template or raw text). Shared by run, chat and bench."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specgen.app import skipsets
from specgen.app.store import RunRecord
from specgen.core.drafters import check_pair, make_drafter
from specgen.core.engine import GenerationResult, SpeculativeGenerator
from specgen.core.stats import Stats
from specgen.errors import ConfigError
from specgen.loading.load import LoadedPair, load_pair
from specgen.profiles import DEFAULT_PROFILE, Profile, load_profile, with_overrides


@dataclass
class Session:
    profile: Profile
    pair: LoadedPair
    generator: SpeculativeGenerator
    skip: skipsets.Resolved | None = None  # what the self drafter skips, where it drafts
    notices: list[str] = field(default_factory=list)  # lines for the user, shown once

    @property
    def tokenizer(self):
        return self.pair.tokenizer

    def eos_ids(self) -> list[int]:
        """End of generation: the target's generation config and the tokenizer's EOS."""
        ids = getattr(self.pair.target.generation_config, "eos_token_id", None)
        ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return sorted(set(ids))

    def sampling_kwargs(self, seed: int | None = None) -> dict:
        g = self.profile.generation
        return dict(
            max_new_tokens=g.max_new_tokens,
            temperature=g.temperature,
            top_k=g.top_k,
            top_p=g.top_p,
            seed=seed,
            eos_token_ids=self.eos_ids(),
        )

    def encode(self, prompt: str) -> torch.Tensor:
        """The token ids the profile gives `prompt`: its chat template and system prompt,
        unless the profile says raw."""
        g = self.profile.generation
        return encode_messages(self.tokenizer, messages_for(prompt, g.system_prompt),
                               g.chat_template)

    def generate(self, prompt: str, seed: int | None = None) -> GenerationResult:
        """The profile's answer to `prompt` with its sampling settings; `decode` gives its text."""
        return self.generator.generate(self.encode(prompt), **self.sampling_kwargs(seed))

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def record(self, command: str, stats: Stats, ended: str, prompt: str | None = None) -> RunRecord:
        """The run-history row for one generation of this session."""
        p, g = self.profile, self.profile.generation
        return RunRecord(
            command=command, profile=p.name, target=self.pair.target_name,
            draft=self.pair.draft_name, method=p.speculation.method, device=self.pair.device,
            dtype=self.pair.dtype, quantization=self.pair.quantization, adaptive=stats.adaptive,
            k_max=stats.k_max, temperature=g.temperature, top_p=g.top_p, top_k=g.top_k,
            ended=ended, stats=stats.to_dict(), prompt=prompt,
        )


def open_session(profile: Profile, progress: Callable[[str], None] | None = None,
                 lean: bool = False) -> Session:
    """The profile loaded and ready to generate (see `load`); `lean` as loading.load_pair's:
    for a session that never hands its models to transformers' own forward."""
    return session_of(profile, load_pair(profile, progress, lean))


def session_of(profile: Profile, pair: LoadedPair) -> Session:
    """The session of a loaded pair: its drafter and generator built."""
    if pair.draft is not None:
        check_pair(pair.target, pair.draft)
    spec = profile.speculation
    self_drafts = spec.method == "self" or (spec.method == "hybrid" and pair.draft is None)
    skip = skipsets.resolve(profile, pair) if self_drafts else None  # the target drafts itself
    drafter = make_drafter(
        spec.method,
        pair.draft,
        pair.target.config.get_text_config().vocab_size,
        max_ngram=spec.max_ngram,
        min_ngram=spec.min_ngram,
        head_rows=spec.draft_vocab or None,
        confidence=spec.draft_confidence,
        skip=skip.skip if skip else None,
        head=pair.head,
        window=spec.draft_window,
    )
    generator = SpeculativeGenerator(  # load_pair prepared both models for their roles
        pair.target, drafter, num_speculative_tokens=spec.num_speculative_tokens,
        adaptive=spec.adaptive, prepare=False, tree=spec.tree,
    )
    notices = [skip.notice] if skip is not None and skip.notice else []
    return Session(profile, pair, generator, skip, notices)


def load(profile: str = DEFAULT_PROFILE, progress: Callable[[str], None] | None = None,
         **overrides) -> Session:
    """A profile loaded as `specgen run` loads it, ready to generate: the models found,
    verified, converted, checked and prepared for their roles (kernels.prepare), the drafter
    and the generator built. The models are transformers' classes (`run` builds specgen's
    own tree where it can), so they also serve transformers' own `generate`. `overrides`
    are those of profiles.with_overrides (temperature, max_new_tokens,
    num_speculative_tokens, method, device, ...), validated before anything loads;
    `progress(message)` hears what is loading."""
    return open_session(with_overrides(load_profile(profile), where="specgen.load", **overrides),
                        progress)


def encode_messages(tokenizer, messages: list[dict[str, str]], use_template: bool) -> torch.Tensor:
    """Token ids for a conversation: the tokenizer's chat template with a generation prompt,
    or, without a template (or with --raw), the last message's text as plain continuation."""
    if use_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(messages[-1]["content"])["input_ids"]
    if not ids:
        raise ConfigError("The prompt is empty after tokenization: give some text.")
    return torch.tensor(ids, dtype=torch.long)


def messages_for(prompt: str, system: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": prompt}]
