"""Doors: each wire format, parsed at its edge into the one request (`gateway/protocol.Generate`)
and answered in its own shapes.

`ws_door.py` (the WebSocket protocol; `ws_protocol.py` reads its frames), `openai_door.py` (the OpenAI
API over HTTP and SSE: `openai_schema.py` reads a body, `openai_render.py` writes answers and
chunks, `http_answers.py` gathers several prompts of one body, `http_body.py`, `http_errors.py`),
`responses_door.py` (`/v1/responses`: `responses_schema.py`, `responses_render.py`,
`response_store.py`), `answer_wait.py` (what both HTTP answer doors share: admit, wait for events,
notice a client leaving), `embeddings.py` (`/v1/embeddings`), `rerank_door.py` (`/v1/rerank`,
`/v1/score`: `rerank_schema.py`, `rerank_models.py`), `held_models.py` (keys, limits and usage of
the requests answered with the models the gateway holds), `tokenize_door.py` (`/tokenize`,
`/detokenize`, `/tokenizer_info`), `utility_routes.py` (`/health`, `/ping`, `/version`). Every
door admits through `gateway/admission`; a door imports another door's module only for the
OpenAI formats and the parts named above as shared.
"""
