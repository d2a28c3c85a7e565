"""The benchmarks of `brigade bench <target>` (their parser is ops/commands/bench.py): each measures
one part of Brigade and returns a report, printed as JSON. They stand above every floor but the
commands (they may import any part they measure), so the library packages never carry them."""
