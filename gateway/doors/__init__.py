"""Doors: each wire format, parsed at its edge into the one request (`gateway/protocol.Generate`)
and answered in its own shapes.

`ws_door.py` (the WebSocket protocol), `http_door.py` (the OpenAI API over HTTP and SSE:
`openai_schema.py` reads a body, `openai_render.py` writes answers and chunks, `http_body.py`,
`http_errors.py`), `embeddings.py` (`/v1/embeddings`), `tokenize_door.py` (`/tokenize`,
`/detokenize`), `utility_routes.py` (`/health`, `/ping`, `/version`). Every door admits through
`gateway/admission`; none imports another door's module but the OpenAI formats.
"""
