"""Incremental detokenization never emits half a character or half a stop string."""
from __future__ import annotations

import pytest

from engine.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def stream(tokenizer, text: str, stop=()) -> tuple[list[str], IncrementalDetokenizer]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer, [], tuple(stop))
    deltas = []
    for t in ids:
        deltas.append(detok.push(t))
        if detok.stopped:
            break
    return deltas, detok


def test_multibyte_characters_are_never_split(tokenizer):
    text = "Émojis 😀🎉 and 日本語 text, naïve café."
    deltas, detok = stream(tokenizer, text)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + detok.flush() == text


def test_stop_string_and_its_prefix_are_never_emitted(tokenizer):
    deltas, detok = stream(tokenizer, "The capital of France is Paris, of course.", stop=["Paris"])
    assert detok.stopped
    assert "".join(deltas) == "The capital of France is "
    assert detok.flush() == ""


def test_held_back_prefix_is_released_when_it_does_not_become_the_stop(tokenizer):
    deltas, detok = stream(tokenizer, "Par is not Paris", stop=["Paris!"])
    assert not detok.stopped
    assert "".join(deltas) + detok.flush() == "Par is not Paris"
