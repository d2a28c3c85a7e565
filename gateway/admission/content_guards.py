"""Content guards: pluggable checks of a prompt before it is queued and of the answer as it streams.

`BRIGADE_GUARDS=module:callable,...` names them. Each callable takes a `GuardInput` and returns
None to allow, or a short refusal reason. At the prompt stage `output` is None; on the output
stream it holds the answer so far and `new_text` the part just added (cached answers pass the
same checks). A refusal ends the request with `content_blocked`, naming the guard; an output
refusal also stops generation and frees the worker's slot.

Prompt checks run on a thread, so a guard may call a slow classifier there. Output checks run on
the gateway's event loop for every streamed chunk: keep them fast (a regex over `new_text` and
a short tail), or look only at sentence ends. Two real guards ship here: `sanitize` (size and
characters) and `patterns` (a list of regular expressions: known prompt-injection phrases by
default, or a blocked-terms file, `BRIGADE_GUARD_PATTERNS_FILE`). A guard whose callable takes a
`settings` keyword is given the gateway's settings when it is loaded (both shipped guards do);
called without them, it uses the settings' documented defaults.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from ops.core.messages import ChatMessage
from ops.core.settings import Settings


@dataclass(frozen=True)
class GuardInput:
    request_id: str
    model: str
    prompt: str | None
    messages: list[ChatMessage] | None
    key_name: str | None = None  # the API key's name, when keys are on
    output: str | None = None  # the answer so far (output stage only)
    new_text: str = ""  # the part of `output` just added

    @property
    def prompt_text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(m.content for m in self.messages or [])


Guard = Callable[[GuardInput], "str | None"]


@dataclass(frozen=True)
class NamedGuard:
    name: str  # module:callable, as configured
    check: Guard


class GuardConfigError(ValueError):
    """BRIGADE_GUARDS names something that cannot be used: the gateway does not start."""


@dataclass(frozen=True)
class GuardRefusal:
    guard: str  # module:callable, as configured
    reason: str


# The built-in guards' module before the gateway's sub-packages: a BRIGADE_GUARDS written then still loads.
_MOVED = {"gateway.content_guards": __name__}


def load_guards(spec: str, settings: Settings | None = None) -> list[NamedGuard]:
    """`module:callable,...` -> the callables (given `settings` where they take them); a name that
    does not resolve fails at start, clearly."""
    guards = []
    for name in (part.strip() for part in spec.split(",")):
        if not name:
            continue
        module_name, _, attr = name.partition(":")
        module_name = _MOVED.get(module_name, module_name)
        if not attr:
            raise GuardConfigError(f"BRIGADE_GUARDS entry {name!r} must be module:callable")
        try:
            check = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise GuardConfigError(f"BRIGADE_GUARDS entry {name!r} cannot be loaded: {exc}") from None
        if not callable(check):
            raise GuardConfigError(f"BRIGADE_GUARDS entry {name!r} is not callable")
        if settings is not None and _takes_settings(check):
            check = functools.partial(check, settings=settings)
        guards.append(NamedGuard(name, check))
    return guards


def _takes_settings(check: Callable) -> bool:
    try:
        return "settings" in inspect.signature(check).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return False


def _setting(settings: Settings | None, name: str):
    """A guard's setting: the gateway's, else its documented default (a guard called on its own)."""
    return getattr(settings, name) if settings is not None else Settings.model_fields[name].default


def first_refusal(guards: list[NamedGuard], data: GuardInput) -> GuardRefusal | None:
    for guard in guards:
        reason = guard.check(data)
        if reason:
            return GuardRefusal(guard.name, str(reason))
    return None


# ---- the shipped guards ---------------------------------------------------------------------------

# Characters that hide text from a reader but not from the model: control characters (other than
# tab and newlines), bidirectional overrides, and zero-width characters (a known way to smuggle
# instructions past a human review).
_INVISIBLE = {"\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"}
_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def sanitize(data: GuardInput, settings: Settings | None = None) -> str | None:
    """Refuse oversized prompts and characters a reader cannot see. Output: passes (checks prompts)."""
    if data.output is not None:
        return None
    text = data.prompt_text
    limit = _setting(settings, "guard_max_chars")
    if len(text) > limit:
        return f"the prompt has {len(text)} characters; this service accepts at most {limit}"
    for ch in text:
        if ch in "\t\n\r":
            continue
        if ch in _INVISIBLE or ch in _BIDI or unicodedata.category(ch) in ("Cc", "Cs", "Co"):
            return f"the prompt contains an invisible or control character (U+{ord(ch):04X})"
    return None


DEFAULT_PATTERNS = (
    r"ignore (all |any )?(the )?(previous|prior|above) (instructions|prompts?|rules)",
    r"disregard (all |any )?(the )?(previous|prior|above) (instructions|prompts?|rules)",
    r"forget (all |everything )?(you were told|your instructions)",
    r"reveal (your|the) (system prompt|hidden instructions)",
    r"you are now (in )?(DAN|developer mode|jailbreak)",
)
_TAIL = 256  # output stage: the new text plus this much before it, so a phrase split across chunks is seen


@lru_cache(maxsize=8)
def _compiled(path: str) -> re.Pattern:
    lines = DEFAULT_PATTERNS
    if path:
        lines = tuple(
            s for s in (line.strip() for line in Path(path).read_text().splitlines()) if s and not s.startswith("#")
        )
    return re.compile("|".join(f"(?:{p})" for p in lines), re.IGNORECASE) if lines else re.compile(r"(?!)")


def patterns(data: GuardInput, settings: Settings | None = None) -> str | None:
    """Refuse a prompt or an answer that matches any configured pattern."""
    pattern = _compiled(_setting(settings, "guard_patterns_file"))
    if data.output is None:
        text = data.prompt_text
    else:
        text = data.output[-(len(data.new_text) + _TAIL):]
    found = pattern.search(text)
    if found:
        where = "prompt" if data.output is None else "answer"
        return f"the {where} matches a blocked pattern ({found.group(0)[:60]!r})"
    return None


def configured(settings: Settings) -> list[NamedGuard]:
    return load_guards(settings.guards, settings)
