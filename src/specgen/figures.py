"""Figures derived from a run's counts, shared by the engine's Stats and the summaries of
the run history (which must not import torch)."""

from __future__ import annotations


def step_speedup(new_tokens: int, target_passes: int, steps: int, draft_seconds: float,
                 verify_seconds: float) -> float:
    """The steps' estimated speedup over plain decoding of the same tokens, taking one
    verify pass as the cost of one plain step (slightly optimistic: a pass over K+1 tokens
    costs a little more); 0.0 without steps. Also of several runs' counts summed. Passes
    that are no step are the prompts' (none in records made before the prompt's pass gave
    a token); they and their tokens cost the same in plain decoding, so they are left out."""
    spent = draft_seconds + verify_seconds
    if not spent or not steps:
        return 0.0
    stepped = new_tokens - (target_passes - steps)
    return stepped * (verify_seconds / steps) / spent
