"""The top floor: the `brigade` command line. cli.py builds the parser and hands the one Settings to
each command; the commands talk to a running service or read its Redis (chat, status, keys, cache,
batch, models, canary), start one (up, worker) or run a benchmark (bench.py, the parser of
`brigade bench`). Nothing below imports this package."""
