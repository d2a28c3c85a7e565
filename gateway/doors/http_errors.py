"""A refusal as an HTTP response, in OpenAI's error shape, for every HTTP door (the OpenAI API,
/v1/files and /v1/batches): the status of its code, and `Retry-After` when a retry may succeed;
and a door's own failure on a request (`internal_error`), logged with its traceback.
"""
from __future__ import annotations

import logging

from starlette.responses import JSONResponse

from gateway.doors import openai_schema as oa
from gateway.request import ProtocolError

log = logging.getLogger("brigade.gateway")


def error_response(err: ProtocolError, retry_after_s: float | None = None) -> JSONResponse:
    status = oa.status_of(err.code)
    headers = {}
    retry = err.retry_after_s if err.retry_after_s is not None else retry_after_s
    if status in (429, 503) and retry is not None:
        headers["Retry-After"] = str(max(1, int(retry + 0.999)))
    return JSONResponse(oa.error_body(err.code, err.message, err.field), status_code=status, headers=headers)


def internal_error(event: str, what: str = "on this request", **fields: object) -> JSONResponse:
    """The answer to a door's own failure (never the caller's): logged as `event=` with the fields and
    the traceback (call it in an `except`), answered 500 `internal_error`."""
    log.exception("event=%s%s", event, "".join(f" {name}={value}" for name, value in fields.items()))
    return error_response(ProtocolError("internal_error", f"the gateway failed {what}"))
