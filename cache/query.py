"""What a request looks like to the cache: its exact key, its namespace and its question.

- The exact key covers everything that changes the output: the model, the prompt as rendered by
  the chat template, and the sampling fields that matter (for greedy requests, top-p, top-k and
  seed do not, so they are left out).
- The namespace is the same digest with the user's last question replaced by a placeholder:
  entries only match within the same model, system prompt, earlier turns and sampling fields.
- The question is the text that is embedded: the last user message, or the raw prompt.

Every request may use the cache. A greedy or seeded one has one answer, stored once. A sampled one
(temperature above 0, no seed) has many: the cache keeps a pool of up to `cache_samples` of them
per question, filled by the model while it is short, then served one at random (cache/lookup_path.py).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from engine import chat_prompt
from engine.tokenizer import read_tokenizer
from ops.core.messages import ChatMessage, GenerateParams

CACHE_MODES = ("auto", "off", "exact")
_PLACEHOLDER = "\u241fQUESTION\u241f"


@dataclass(frozen=True)
class CacheQuery:
    exact_key: str
    namespace: str
    question: str
    sampled: bool  # temperature above 0 and no seed: answers form a pool
    mode: str  # auto | exact | off
    threshold: float | None = None  # per-request override of the cosine that serves (hit_rule.serve_cosine)


class PromptRenderer:
    """Renders chat messages with the served model's own chat template (tokenizer files only).

    A gateway without the model folder falls back to canonical JSON of the messages: keys then
    differ from the rendered form only where two message lists render the same (a default
    system prompt written out), which costs a miss, never a wrong hit.
    """

    def __init__(self, model_dir: str | Path):
        self.tokenizer = None
        if (Path(model_dir) / "tokenizer_config.json").exists():
            self.tokenizer = read_tokenizer(Path(model_dir))

    def render(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True) -> str:
        """The prompt text the engine tokenizes for these messages (engine/chat_prompt.py, the call
        the engine's `encode` makes): for cache keys and for /tokenize."""
        if self.tokenizer is None:
            return json.dumps([messages, tools] if tools else messages, sort_keys=True, ensure_ascii=False)
        return chat_prompt.render(self.tokenizer, messages, tools, add_generation_prompt)


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:40]


def output_fields(params: GenerateParams) -> dict:
    if params.unset:  # a bug: the protocol fills every field before a request reaches the cache
        raise ValueError(f"sampling fields {params.unset} are unset: fill them with the model's defaults first")
    # Each field as its declaration says (ops/core/messages.GenerateParams, Role.key): a field that
    # departs from its default only then, so an ordinary request keeps the key it always had.
    return params.key_fields()


def cacheable(params: GenerateParams) -> bool:
    """Whether a stored answer can satisfy the request: it has one text and no scores, so a request
    that sets an "uncached" field (Role.key: logprobs, prompt logprobs, several choices) away from
    its default is answered by the model (and not stored)."""
    defaults = params.defaults()
    return all(getattr(params, name) == defaults[name] for name, role in params.roles().items()
               if role.key == "uncached")


def make_query(
    renderer: PromptRenderer,
    model: str,
    prompt: str | None,
    messages: list[ChatMessage] | None,
    params: GenerateParams,
    mode: str = "auto",
    threshold: float | None = None,
    tools: list[dict] | None = None,
) -> CacheQuery | None:
    """The request as the cache sees it; None when no stored answer could satisfy it (`cacheable`)."""
    if not cacheable(params):
        return None
    fields = output_fields(params)
    if messages is not None:
        dicts = [m.model_dump(exclude_none=True) for m in messages]
        rendered = renderer.render(dicts, tools)
        last_user = max((i for i, m in enumerate(dicts) if m["role"] == "user"), default=None)
        if last_user is None:
            question, context = "", rendered
        else:
            question = dicts[last_user]["content"]
            masked = [dict(m) for m in dicts]
            masked[last_user]["content"] = _PLACEHOLDER
            context = renderer.render(masked, tools)
    else:
        rendered, question, context = prompt or "", prompt or "", "raw:" + _PLACEHOLDER
    return CacheQuery(
        exact_key=_digest(model, rendered, fields),
        namespace=_digest(model, context, fields),
        question=question.strip(),
        sampled=params.temperature > 0 and params.seed is None,
        mode=mode,
        threshold=threshold,
    )
