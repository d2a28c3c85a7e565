"""Why an answer ends with the token it just took (vLLM's stop checker), and the text it releases.

In order: end-of-sequence (unless ignore_eos), a stop string (engine/detokenizer.py), a stop token
id, a guide whose grammar is complete: "stop"; max_tokens or the model's context: "length".
Nothing but the length ends an answer before min_tokens (vLLM's rule: its EOS and stop token ids
are masked, engine/logits_processing.py, and its stop strings not looked for).
"""
from __future__ import annotations

from engine.sequence import FinishReason, Sequence


def advance(seq: Sequence, token: int, eos_ids: set[int], context_length: int) -> tuple[FinishReason | None, str]:
    """seq just took `token` (already in its output): the text it releases, and why seq ends
    with it (None: it goes on). Its guide's matcher, if any, accepts the token."""
    p, detok = seq.params, seq.detok
    may_stop = len(seq.output_ids) >= p.min_tokens
    if seq.matcher is not None:
        seq.matcher.accept(token)
    reason = None
    if token in eos_ids and not p.ignore_eos and may_stop:
        text, reason = "", FinishReason.STOP  # EOS's own text is never part of the answer
    else:
        text = detok.push(token, check_stop=may_stop)
        if detok.stopped or (may_stop and token in p.stop_token_ids):
            reason = FinishReason.STOP
        elif seq.matcher is not None and seq.matcher.done:
            reason = FinishReason.STOP
        elif len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= context_length:
            reason = FinishReason.LENGTH
    # Text held back as a possible stop string is final once the answer ends otherwise.
    if reason is FinishReason.LENGTH or (reason is FinishReason.STOP and not detok.stopped):
        text += detok.flush()
    return reason, text
