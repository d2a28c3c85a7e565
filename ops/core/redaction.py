"""Secrets out of everything Brigade prints: error messages, log lines, tracebacks.

Three kinds of secret reach the command line and the logs: Brigade API keys (`brg_<id>_<secret>`),
passwords inside URLs (`redis://:PASSWORD@host`, `?password=`), and whatever value follows
`--api-key` (a key of another server, such as an OpenAI-compatible one, need not look like ours).
`redact` replaces each with `***` and keeps the rest, so that a message still says what went wrong:
a Brigade key keeps its id (not secret: `brigade keys list` shows it), a URL its host and port.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"

# The options whose value is a secret, whatever it looks like.
SECRET_OPTIONS = ("--api-key",)

# brg_<8 hex id>_<secret>: the id stays, the secret goes. Anything else after brg_ goes whole (a
# truncated key is still most of a secret), except a placeholder in capitals such as brg_ID_SECRET.
_BRIGADE_KEY = re.compile(r"\bbrg_([0-9a-f]{8})_[A-Za-z0-9_-]+|\bbrg_(?![A-Z_]+\b)[A-Za-z0-9_-]+")
# scheme://user:PASSWORD@host: up to the last @ before the path, since a careless password may hold one.
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@'\"]*:)[^\s/'\"]*@")
_QUERY_PASSWORD = re.compile(r"([?&](?:password|passwd|pwd|api_key|token)=)[^&\s'\"]*", re.IGNORECASE)
_BEARER = re.compile(r"(\bBearer\s+)[^\s'\",]+", re.IGNORECASE)
_OPTION_VALUE = re.compile(r"((?:%s)(?:=|\s+))[^\s'\",]+" % "|".join(map(re.escape, SECRET_OPTIONS)))


def _brigade_key(match: re.Match) -> str:
    return f"brg_{match.group(1)}_{MASK}" if match.group(1) else f"brg_{MASK}"


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without any secret: the known `secrets` (values the user typed), then every shape of one."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        # Whole words only: a short value (a mistyped key of two letters) must not eat into others.
        text = re.sub(r"(?<![A-Za-z0-9_])%s(?![A-Za-z0-9_])" % re.escape(secret), MASK, text)
    text = _OPTION_VALUE.sub(lambda m: m.group(1) + MASK, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + "@", text)
    text = _QUERY_PASSWORD.sub(lambda m: m.group(1) + MASK, text)
    text = _BEARER.sub(lambda m: m.group(1) + MASK, text)
    return _BRIGADE_KEY.sub(_brigade_key, text)


def redact_url(url: str) -> str:
    """A URL fit to print: its password (in the user part or the query) replaced."""
    return redact(url)


def secrets_in_argv(argv: list[str]) -> list[str]:
    """The secret values on a command line: what follows a secret option (also abbreviated, as
    argparse allows, or written --opt=VALUE), and the passwords inside URLs."""
    found = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if len(name) > 3 and any(option.startswith(name) for option in SECRET_OPTIONS):
            if eq:
                found.append(value)
            elif i + 1 < len(argv):
                found.append(argv[i + 1])
        for match in _URL_PASSWORD.finditer(arg):
            found.append(arg[match.end(1):match.end() - 1])
    return found
