"""Guards that tests plug in through BRIGADE_GUARDS, as an operator plugs in a classifier."""
from __future__ import annotations

from gateway.admission.content_guards import GuardInput

EXPLODE = "PLEASE-EXPLODE-THE-GUARD"


def explode_on_marker(data: GuardInput) -> str | None:
    """A guard with a bug: raises on one marker, so the gateway's 500 path can be provoked."""
    if data.output is None and EXPLODE in data.prompt_text:
        raise RuntimeError("a guard failed")
    return None

EXPLODE_LATER = "PLEASE-EXPLODE-ON-THE-ANSWER"


def explode_on_output(data: GuardInput) -> str | None:
    """A guard with a bug on the output stream, for one marked request."""
    if data.output is not None and EXPLODE_LATER in data.prompt_text:
        raise RuntimeError("an output guard failed")
    return None
