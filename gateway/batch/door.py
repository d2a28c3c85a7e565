"""The Batch API over HTTP, in OpenAI's shapes: /v1/files and /v1/batches.

`POST /v1/files` (multipart: `file`, `purpose=batch`) stores an input file; `POST /v1/batches`
starts a job on it (`input_file_id`, `endpoint`, `completion_window`, `metadata`), or on lines
given inline (Brigade's `input`: a list of request lines), with Brigade's `skip_invalid` and
`warm_cache`; `GET /v1/batches[/{id}]` and `POST /v1/batches/{id}/cancel` follow the job, and
`GET /v1/files/{id}/content` returns the output. With API keys on, a job and its files belong to
the key that made them. The jobs themselves run in whichever gateway holds their lease
(gateway/batch/runner.py).
"""
from __future__ import annotations

import functools
import json
import shutil

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from gateway.admission.auth import Authenticator
from gateway.batch.input import URLS
from gateway.batch.jobs import JobStore, new_id, parse_window, public_view
from gateway.doors.http_errors import error_response
from gateway.request import ProtocolError
from ops.core.settings import Settings

BATCH_FIELDS = {"input_file_id", "endpoint", "completion_window", "metadata", "input", "skip_invalid", "warm_cache"}


def not_found(what: str) -> ProtocolError:
    return ProtocolError("not_found", f"no {what} with that id (or it expired)")


def endpoint(handler):
    """An endpoint of the door: called with the caller's owner id (the API key's, or "" with
    keys off); bad input comes back in OpenAI's error shape."""
    @functools.wraps(handler)
    async def serve(self: "BatchDoor", request: Request) -> Response:
        try:
            return await handler(self, request, await self._owner(request))
        except ProtocolError as err:
            return error_response(err)
        except ValueError as err:
            return error_response(ProtocolError("invalid_field", str(err)))
    return serve


class BatchDoor:
    def __init__(self, settings: Settings, auth: Authenticator, store: JobStore):
        self.settings = settings
        self.auth = auth
        self.store = store

    async def _owner(self, request: Request) -> str:
        key = await self.auth.authenticate(request.headers.get("authorization"))
        return key.id if key is not None else ""

    # ---- files ----------------------------------------------------------------------------------

    @endpoint
    async def upload_file(self, request: Request, owner: str) -> Response:
        limit = self.settings.batch_max_file_bytes
        if int(request.headers.get("content-length") or 0) > limit + 65536:
            raise ProtocolError("prompt_too_long", f"files are limited to {limit} bytes")
        try:
            form = await request.form(max_part_size=limit)
        except Exception as exc:  # not multipart, or a part past the limit
            raise ProtocolError("invalid_message", f"send the file as multipart/form-data (file, purpose): {exc}")
        upload, purpose = form.get("file"), form.get("purpose") or "batch"
        if upload is None or isinstance(upload, str):
            raise ProtocolError("missing_field", "the form needs a `file` part", None, "file")
        if purpose != "batch":
            raise ProtocolError("invalid_field", "`purpose` must be \"batch\"", None, "purpose")
        file_id = new_id("file")
        with open(self.store.path_for(file_id), "wb") as out:
            shutil.copyfileobj(upload.file, out, 1 << 20)
        record = await self.store.add_file(file_id, upload.filename or "input.jsonl", purpose,
                                           self.store.ttl_s(self.settings.batch_completion_window_s), owner)
        return JSONResponse(_file_view(record))

    @endpoint
    async def file(self, request: Request, owner: str) -> Response:
        return JSONResponse(_file_view(await self._own_file(request.path_params["file_id"], owner)))

    @endpoint
    async def file_content(self, request: Request, owner: str) -> Response:
        record = await self._own_file(request.path_params["file_id"], owner)
        return FileResponse(record["path"], media_type="application/jsonl", filename=record["filename"])

    async def _own_file(self, file_id: str, owner: str) -> dict:
        record = await self.store.get_file(file_id)
        if record is None or record.get("owner", "") != owner:
            raise not_found("file")
        return record

    # ---- batches --------------------------------------------------------------------------------

    @endpoint
    async def create_batch(self, request: Request, owner: str) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise ProtocolError("invalid_json", "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ProtocolError("invalid_message", "the request body must be a JSON object")
        unknown = sorted(set(body) - BATCH_FIELDS)
        if unknown:
            raise ProtocolError("unknown_field", f"unrecognized request argument {unknown[0]!r}", None, unknown[0])
        endpoint = body.get("endpoint", "/v1/chat/completions")
        if endpoint not in URLS:
            raise ProtocolError("invalid_field", f"`endpoint` must be one of {', '.join(sorted(URLS))}", None,
                                "endpoint")
        window = parse_window(body.get("completion_window", f"{self.settings.batch_completion_window_s:g}s"))
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ProtocolError("invalid_field", "`metadata` must be an object", None, "metadata")
        if "input" in body:
            lines = body["input"]
            if not isinstance(lines, list) or not lines:
                raise ProtocolError("invalid_field", "`input` must be a non-empty list of request lines", None, "input")
            file_id = new_id("file")
            with open(self.store.path_for(file_id), "w") as out:
                for line in lines:
                    out.write(json.dumps(line) + "\n")
            await self.store.add_file(file_id, "inline.jsonl", "batch", self.store.ttl_s(window), owner)
        else:
            file_id = body.get("input_file_id")
            if not isinstance(file_id, str):
                raise ProtocolError("missing_field", "give `input_file_id` (POST /v1/files) or `input`", None,
                                    "input_file_id")
            await self._own_file(file_id, owner)
        job = await self.store.create(file_id, endpoint, window, metadata, bool(body.get("skip_invalid")),
                                      bool(body.get("warm_cache")), owner)
        return JSONResponse(public_view(job))

    @endpoint
    async def batch(self, request: Request, owner: str) -> Response:
        return JSONResponse(public_view(await self._own_job(request.path_params["batch_id"], owner)))

    @endpoint
    async def cancel_batch(self, request: Request, owner: str) -> Response:
        job = await self._own_job(request.path_params["batch_id"], owner)
        return JSONResponse(public_view(await self.store.request_cancel(job["id"])))

    @endpoint
    async def list_batches(self, request: Request, owner: str) -> Response:
        limit = min(max(int(request.query_params.get("limit", 20)), 1), 100)
        jobs = await self.store.list(limit + 1, request.query_params.get("after"), owner)
        data = [public_view(j) for j in jobs[:limit]]
        return JSONResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                             "last_id": data[-1]["id"] if data else None, "has_more": len(jobs) > limit})

    async def _own_job(self, job_id: str, owner: str) -> dict:
        job = await self.store.get(job_id)
        if job is None or job.get("owner", "") != owner:
            raise not_found("batch")
        return job


def _file_view(record: dict) -> dict:
    return {k: record[k] for k in ("id", "object", "bytes", "created_at", "filename", "purpose")}
