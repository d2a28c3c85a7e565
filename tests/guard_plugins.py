"""Guards that tests plug in through BRIGADE_GUARDS, as an operator plugs in a classifier."""
from __future__ import annotations

from gateway.content_guards import GuardInput

EXPLODE = "PLEASE-EXPLODE-THE-GUARD"


def explode_on_marker(data: GuardInput) -> str | None:
    """A guard with a bug: raises on one marker, so the gateway's 500 path can be provoked."""
    if data.output is None and EXPLODE in data.prompt_text:
        raise RuntimeError("a guard failed")
    return None
