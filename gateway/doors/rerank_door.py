"""`POST /v1/rerank` (also `/rerank` and `/v2/rerank`, as vLLM serves them) and `POST /v1/score`
(also `/score`): pairs of texts scored by a model the gateway holds (gateway/doors/rerank_models.py),
bodies read and answers written by gateway/doors/rerank_schema.py.

Admitted as /v1/embeddings is (gateway/doors/held_models.py): the caller's key, its limits, its
usage (the word pieces the model read) charged once answered; counted in
brigade_rerank_requests_total, brigade_rerank_pairs_total and brigade_rerank_request_seconds by
model, api (rerank, score) and outcome. The scoring and the JSON of the answer run off the event
loop.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from gateway import metrics
from gateway.admission.auth import Authenticator
from gateway.doors.held_models import HeldModelAdmission, outcome_of
from gateway.doors.http_body import read_json
from gateway.doors.http_errors import error_response, internal_error
from gateway.doors.rerank_models import Scorer, ScoringModels
from gateway.doors.rerank_schema import PairsAsk, RerankAsk, parse_rerank, parse_score, rerank_body, score_body
from gateway.request import ProtocolError
from ops.core.settings import Settings

if TYPE_CHECKING:
    from cache.embedder import Embedder
    from cache.pair_model import PairModel


class RerankDoor:
    def __init__(self, settings: Settings, auth: Authenticator, admission: HeldModelAdmission):
        self.settings = settings
        self.auth = auth
        self.admission = admission
        self.models = ScoringModels(settings)

    def use_models(self, embedder: "Embedder", pair_model: "PairModel | None") -> None:
        self.models.use(embedder, pair_model)

    def card(self) -> dict | None:
        return self.models.card()

    async def rerank(self, request: Request) -> Response:
        return await self._serve(request, "rerank")

    async def score(self, request: Request) -> Response:
        return await self._serve(request, "score")

    async def _serve(self, request: Request, api: str) -> Response:
        started = time.perf_counter()
        rid, key, name, pairs = uuid.uuid4().hex, None, self.models.reranker, 0
        try:
            key = await self.auth.authenticate(request.headers.get("authorization"))
            body = await read_json(request, self.settings.max_message_bytes)
            ask = parse_rerank(body, self.settings) if api == "rerank" else parse_score(body, self.settings)
            asked = ask.pairs if isinstance(ask, RerankAsk) else ask
            scorer = self.models.choose(asked.model)
            name, pairs = scorer.name, len(asked.firsts)
            await self.admission.within_limits(key, rid, name)
            try:
                content, tokens = await asyncio.to_thread(_answer, scorer, ask, rid)
            except BaseException:
                self.admission.release(key, rid)
                raise
        except ProtocolError as err:
            self._count(name, api, outcome_of(err), pairs)
            return error_response(err)
        except Exception:
            self._count(name, api, "failed", pairs)
            return internal_error("rerank_failed", api=api, request_id=rid)
        self.admission.settle(key, rid, tokens)
        self._count(name, api, "served", pairs)
        metrics.RERANK_SECONDS.labels(name, api).observe(time.perf_counter() - started)
        return Response(content, media_type="application/json", headers={"x-request-id": rid})

    def _count(self, model: str, api: str, outcome: str, pairs: int) -> None:
        metrics.RERANK_REQUESTS.labels(model, api, outcome).inc()
        metrics.RERANK_PAIRS.labels(model, api, outcome).inc(pairs)


def _answer(scorer: Scorer, ask: RerankAsk | PairsAsk, rid: str) -> tuple[bytes, int]:
    """The response body and its tokens, on a worker thread: the model's passes, and the JSON of up
    to thousands of results, are both too long to hold the event loop."""
    if isinstance(ask, RerankAsk):
        scores, tokens = scorer.score(ask.pairs.firsts, ask.pairs.seconds)
        body = rerank_body(rid, scorer.name, ask, scores, tokens)
    else:
        scores, tokens = scorer.score(ask.firsts, ask.seconds)
        body = score_body(rid, scorer.name, scores, tokens)
    return json.dumps(body, separators=(",", ":")).encode(), tokens
