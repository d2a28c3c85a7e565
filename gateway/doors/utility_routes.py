"""vLLM's small utility routes: `GET /health` and `GET|POST /ping` (SageMaker's name for it), and
`GET /version`. None needs a key: load balancers and orchestrators call them without one.

/health answers what vLLM's does, "can this server take requests": 200 with an empty body when
Redis answers (a request can be queued; one waits for a worker if none is alive yet, as a vLLM
request waits for its engine's step), 503 with an `unavailable` error body when it does not. The
check is the gateway's readiness (server.py's `readiness`, also behind /readyz), handed in, not
written twice; /readyz stays the stricter "a worker is alive too".
"""
from __future__ import annotations

from importlib import metadata
from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.doors import openai_schema as oa

Readiness = Callable[[], Awaitable[dict]]


def package_version() -> str:
    try:
        return metadata.version("brigade")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


class UtilityRoutes:
    def __init__(self, readiness: Readiness):
        self.readiness = readiness
        self.version_body = {"version": package_version()}

    async def health(self, request: Request) -> Response:
        report = await self.readiness()
        if report.get("redis"):
            return Response(status_code=200)
        reason = report.get("reason") or "redis unreachable"
        return JSONResponse(oa.error_body("unavailable", f"the gateway cannot take requests now: {reason}"),
                            status_code=oa.status_of("unavailable"))

    async def version(self, request: Request) -> JSONResponse:
        return JSONResponse(self.version_body)
