"""Admission: the one path in for every door, and a request's life until it is settled.

`admission.py` takes a checked `Generate` (gateway/request.py) through the model version it runs
on (`catalog.py`), the caller's key and limits (`auth.py`, `api_keys.py`, `limits.py`), the
content guards (`content_guards.py`), the answer cache, the load (`load.py`) and the queue
(`request_store.py` keeps what was sent); `audits.py` and `shadows.py` ask the model again beside
it. `lifecycle.py` follows an admitted request to its end: delivery of its events, cancel,
resume, and settling (usage, the cache, outcomes).
"""
