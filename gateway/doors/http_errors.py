"""A refusal as an HTTP response, in OpenAI's error shape, for every HTTP door (the OpenAI API,
/v1/files and /v1/batches): the status of its code, and `Retry-After` when a retry may succeed.
"""
from __future__ import annotations

from starlette.responses import JSONResponse

from gateway.doors import openai_schema as oa
from gateway.request import ProtocolError


def error_response(err: ProtocolError, retry_after_s: float | None = None) -> JSONResponse:
    status = oa.status_of(err.code)
    headers = {}
    retry = err.retry_after_s if err.retry_after_s is not None else retry_after_s
    if status in (429, 503) and retry is not None:
        headers["Retry-After"] = str(max(1, int(retry + 0.999)))
    return JSONResponse(oa.error_body(err.code, err.message, err.field), status_code=status, headers=headers)
