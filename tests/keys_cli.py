"""The `brigade keys` command line as the API-key tests parse it (tests/test_api_keys.py with a
real Redis, tests/test_api_keys_offline.py without one)."""
from __future__ import annotations

import argparse

from ops.commands.keys import add_parser


def parse(*argv: str):
    parser = argparse.ArgumentParser(prog="brigade")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["keys", *argv])
