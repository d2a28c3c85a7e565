"""A whole Brigade started as processes on one machine: the supervisor that starts, watches and
stops the parts in order, and a local Redis HA set. `brigade up`, the benchmarks that break a
Brigade and the tests start their stacks through it; it stands on ops.core alone and imports no
part it starts (each is a child process), tests/test_floors.py.
"""
