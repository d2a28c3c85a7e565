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
    # Libraries that log every request at INFO would drown Brigade's own events.
    for name in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(name).setLevel(logging.WARNING)
