"""The `brigade` commands that talk to a running service or read its Redis (chat, status, keys,
cache, batch) and capacity planning; ops/cli.py builds the parser and calls each one's `run`."""
