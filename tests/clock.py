"""A clock a test moves by hand, for code that takes `clock: Callable[[], float]` (the engine and
its scheduler): waits are driven, not slept."""
from __future__ import annotations


class HandClock:
    def __init__(self, start: float = 1_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
