"""Structured logs: one event per line, key=value, request id on every line about a request."""
from __future__ import annotations

import logging
import os


def setup_logging(level: str | None = None) -> None:
    level = (level or os.environ.get("BRIGADE_LOG_LEVEL", "INFO")).upper()
    logging.basicConfig(
        level=level,
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    # Libraries that log every request at INFO would drown Brigade's own events: HTTP clients and
    # uvicorn's access log (two lines per /readyz poll), Celery's "received" and "succeeded" per
    # task (the worker's own event=request_done line says more, once), and faiss's loader, which
    # reports at INFO the optional AVX-512 module it did not find (a ModuleNotFoundError).
    for name in ("httpx", "httpcore", "uvicorn.access", "celery.worker.strategy", "celery.app.trace",
                 "faiss.loader"):
        logging.getLogger(name).setLevel(logging.WARNING)
