"""vLLM's `POST /tokenize`, `POST /detokenize` and `GET /tokenizer_info`, with the served model's own
tokenizer.

A prompt or chat messages in, the token ids the engine would run out; ids in, text out. Messages
go through the same translation and checks as a chat completion (openai_schema.chat_messages,
then the rules every door shares: gateway/request.py), and are rendered by the cache's
`PromptRenderer`, the same chat-template call the engine's `encode` makes, so that `count` equals
a chat answer's `usage.prompt_tokens` for the same messages. Each model version's tokenizer files
are read from its folder on this machine (catalog.folder), once, off the event loop; a fast
tokenizer is not safe to share between threads, so each has a lock.

`/tokenizer_info` is the tokenizer's configuration as vLLM gives it (its `tokenizer_config.json`
as loaded: special tokens as their text, the chat template, `tokenizer_class`): with it and
/tokenize, an evaluation harness (lm-evaluation-harness's `tokenizer_backend=remote`) tokenizes
with the server instead of downloading the tokenizer from a hub by the model's name.

Bodies are checked here without a socket (`parse_tokenize`, `parse_detokenize`); unknown fields are
refused as the rest of the OpenAI door refuses them. Keys are checked as for /v1/models.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from cache.query import PromptRenderer
from gateway.admission.auth import Authenticator
from gateway.admission.catalog import Catalog
from gateway.doors import openai_schema as oa
from gateway.doors.http_body import read_json
from gateway.doors.http_errors import error_response, internal_error
from gateway.request import ProtocolError, RequestRules
from ops.core.settings import Settings


TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_generation_prompt", "add_special_tokens", "return_token_strs",
                   "tools"}
DETOKENIZE_FIELDS = {"model", "tokens"}


@dataclass(frozen=True)
class TokenizeAsk:
    model: str
    version: str  # pinned by `model: "name@version"`; "": the stable one's tokenizer
    prompt: str | None
    messages: list[dict] | None  # as the worker renders them (ChatMessage.model_dump())
    tools: list[dict] | None
    add_generation_prompt: bool
    add_special_tokens: bool
    return_token_strs: bool


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ProtocolError("invalid_field", f"`{name}` must be a boolean", None, name)
    return value


def parse_tokenize(body: Any, rules: RequestRules) -> TokenizeAsk:
    """A /tokenize body -> what to tokenize, checked as a completion's prompt or messages are."""
    body = oa.checked_body(body, TOKENIZE_FIELDS)
    chat = body.get("messages") is not None
    # exactly one of prompt and messages, the model known, lengths, tools (only beside messages)
    cmd = rules.generate("tokenize", sampling={}, model=body.get("model"), tools=body.get("tools"),
                         prompt=body.get("prompt"),
                         messages=oa.chat_messages(body["messages"]) if chat else None)
    # as the worker hands them to the engine (workers/inflight.py)
    messages = [m.model_dump(exclude_none=True) for m in cmd.messages] if cmd.messages is not None else None
    return TokenizeAsk(cmd.model, cmd.version, cmd.prompt, messages, cmd.tools,
                       add_generation_prompt=_flag(body, "add_generation_prompt", True),
                       # vLLM's defaults: a chat template writes its own special tokens
                       add_special_tokens=_flag(body, "add_special_tokens", not chat),
                       return_token_strs=_flag(body, "return_token_strs", False))


def parse_detokenize(body: Any, catalog: Catalog) -> tuple[str, str, list[int]]:
    """A /detokenize body -> (model, pinned version, token ids); ids are checked against the vocabulary later."""
    body = oa.checked_body(body, DETOKENIZE_FIELDS)
    model, version = catalog.resolve(body.get("model"))
    tokens = body.get("tokens")
    if tokens is None:
        raise ProtocolError("missing_field", "`tokens` is required: a list of token ids", None, "tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ProtocolError("invalid_field", "`tokens` must be a list of integer token ids", None, "tokens")
    return model, version, tokens


class ModelTokenizer:
    """One folder's tokenizer and chat template, one call at a time."""

    def __init__(self, folder: Path):
        self.renderer = PromptRenderer(folder)
        self.tokenizer = self.renderer.tokenizer
        self._lock = threading.Lock()

    def tokenize(self, ask: TokenizeAsk) -> tuple[list[int], list[str] | None]:
        with self._lock:
            if ask.messages is not None:
                text = self.renderer.render(ask.messages, ask.tools, ask.add_generation_prompt)
            else:
                text = ask.prompt
            ids = self.tokenizer(text, add_special_tokens=ask.add_special_tokens)["input_ids"]
            strs = self.tokenizer.convert_ids_to_tokens(ids) if ask.return_token_strs else None
        return ids, strs

    def info(self, model: str) -> dict[str, Any]:
        """vLLM's /tokenizer_info: the tokenizer's configuration as loaded, JSON-ready, file paths
        left out and the folder's path named by the model it serves."""
        config = {k: _plain(v) for k, v in (getattr(self.tokenizer, "init_kwargs", None) or {}).items()
                  if k not in ("vocab_file", "merges_file", "tokenizer_file")}
        config["name_or_path"] = model
        config["tokenizer_class"] = type(self.tokenizer).__name__
        if self.tokenizer.chat_template:
            config["chat_template"] = self.tokenizer.chat_template
        return config

    def detokenize(self, tokens: list[int]) -> str:
        with self._lock:
            size = len(self.tokenizer)
            bad = next((t for t in tokens if not 0 <= t < size), None)
            if bad is not None:
                raise ProtocolError("invalid_field", f"token id {bad} is out of range: this model's ids are 0 to "
                                    f"{size - 1}", None, "tokens")
            return self.tokenizer.decode(tokens)


class TokenizeDoor:
    def __init__(self, settings: Settings, rules: RequestRules, auth: Authenticator, catalog: Catalog):
        self.settings = settings
        self.rules = rules
        self.auth = auth
        self.catalog = catalog
        self._tokenizers: dict[str, ModelTokenizer] = {}

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await self._checked_body(request)
            ask = parse_tokenize(body, self.rules)
            tokenizer = await self._tokenizer(ask.model, ask.version)
            ids, strs = await asyncio.to_thread(tokenizer.tokenize, ask)
            return JSONResponse({"count": len(ids), "max_model_len": self.catalog.max_model_len(ask.model),
                                 "tokens": ids, "token_strs": strs})
        except ProtocolError as err:
            return error_response(err)
        except Exception:
            return internal_error("tokenize_failed", "to tokenize this request")

    async def detokenize(self, request: Request) -> Response:
        try:
            body = await self._checked_body(request)
            model, version, tokens = parse_detokenize(body, self.catalog)
            tokenizer = await self._tokenizer(model, version)
            return JSONResponse({"prompt": await asyncio.to_thread(tokenizer.detokenize, tokens)})
        except ProtocolError as err:
            return error_response(err)
        except Exception:
            return internal_error("detokenize_failed", "to detokenize this request")

    async def tokenizer_info(self, request: Request) -> Response:
        try:
            await self.auth.authenticate(request.headers.get("authorization"))
            model, version = self.catalog.resolve(request.query_params.get("model"))
            tokenizer = await self._tokenizer(model, version)
            return JSONResponse(tokenizer.info(model))
        except ProtocolError as err:
            return error_response(err)
        except Exception:
            return internal_error("describe_the_tokenizer_of_failed", "to describe the tokenizer of this request")

    async def _checked_body(self, request: Request) -> Any:
        await self.auth.authenticate(request.headers.get("authorization"))
        return await read_json(request, self.settings.max_message_bytes)

    async def _tokenizer(self, model: str, version: str) -> ModelTokenizer:
        version = version or self.catalog.snapshot.stable.get(model, "")
        folder = self.catalog.folder(model, version)
        key = str(folder)
        if key not in self._tokenizers:
            if folder is None or not (folder / "tokenizer_config.json").exists():
                raise ProtocolError("unavailable", f"the tokenizer files of {model} are not on this gateway's machine "
                                    f"(looked in {folder or 'the model store'})", None, "model")
            self._tokenizers[key] = await asyncio.to_thread(ModelTokenizer, folder)
        return self._tokenizers[key]


def _plain(value: Any) -> Any:
    """A tokenizer setting as JSON: a special token (AddedToken) as its text, containers walked."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
