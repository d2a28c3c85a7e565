"""A degenerate loop, noticed as it happens: an answer whose last `span` tokens repeat one unit of
1 to MAX_PERIOD tokens over and over ("la femme femme, la femme femme, ...": a small model that
sampled one unlikely token early) ends with finish_reason "repetition" instead of running on to
max_tokens. Every token until then is the model's own, so the text is the start of the answer the
model would have given (in the exact default, Hugging Face's greedy text cut where the loop had
run `span` tokens); a client sees why it ended (OpenAI's API calls it "length": cut short).

The test is exact: the tail is periodic token for token, at least 3 times round. A list, a table or
code that repeats a line with anything changed in it is not a loop; an answer asked to repeat one
thing `span` tokens long is, and `BRIGADE_REPETITION_STOP_TOKENS=0` serves it (docs/settings.md).
A request with ignore_eos asked for exactly max_tokens, and gets them; min_tokens are never cut.

Per token, one comparison per period: for each period p, how many tokens in a row equalled the one p
before them (`runs[p]`); the tail is periodic over runs[p] + p tokens.
"""
from __future__ import annotations

MAX_PERIOD = 32  # the longest repeating unit looked for, in tokens
MIN_TURNS = 3  # times round the unit must go, however short the span


class RepeatWatch:
    """One sequence's periodic tails, fed each output token as it is taken."""

    def __init__(self, span: int):
        self.span = span
        self.runs = [0] * (MAX_PERIOD + 1)

    def took(self, output_ids: list[int]) -> bool:
        """The output so far, its last token just taken: True when its last `span` tokens (or more)
        are one unit going round at least MIN_TURNS times."""
        last, n = output_ids[-1], len(output_ids)
        looping = False
        for p in range(1, min(MAX_PERIOD, n - 1) + 1):
            run = self.runs[p] + 1 if output_ids[n - 1 - p] == last else 0
            self.runs[p] = run
            if run + p >= self.span and run >= (MIN_TURNS - 1) * p:
                looping = True
        return looping
