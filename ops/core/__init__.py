"""Brigade's foundation: what every process shares and nothing of Brigade's above it.

Settings, the key schema (each key with its TTL or cap), the message shapes, logs, ports, the
live-worker registry and its scale signal, the one Redis client factory, the queue's sending side
and every Lua script. This package imports nothing else of Brigade; tests/test_floors.py fails if
it does.
"""
