"""Structured logs: one event per line, key=value, request id on every line about a request."""
from __future__ import annotations

import logging

from ops.core.redaction import redact

FORMAT = "ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"


class RedactingFormatter(logging.Formatter):
    """Every line and traceback without secrets: a library's message may quote a URL with its
    password, or a request's headers (ops/core/redaction.py)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def setup_logging(level: str = "INFO") -> None:
    """Brigade's log lines at `level` (the settings' log_level), libraries' per-request lines off."""
    level = (level or "INFO").upper()  # BRIGADE_LOG_LEVEL set empty: the default
    root = logging.getLogger()
    if not root.handlers:  # as logging.basicConfig: logging configured before stays as it was
        handler = logging.StreamHandler()
        handler.setFormatter(RedactingFormatter(FORMAT))
        root.addHandler(handler)
        root.setLevel(level)
    # Libraries that log every request at INFO would drown Brigade's own events: HTTP clients and
    # uvicorn's access log (two lines per /readyz poll), Celery's "received" and "succeeded" per
    # task (the worker's own event=request_done line says more, once), and faiss's loader, which
    # reports at INFO the optional AVX-512 module it did not find (a ModuleNotFoundError).
    for name in ("httpx", "httpcore", "uvicorn.access", "celery.worker.strategy", "celery.app.trace",
                 "faiss.loader"):
        logging.getLogger(name).setLevel(logging.WARNING)
