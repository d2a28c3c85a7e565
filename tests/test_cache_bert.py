"""cache/bert.py: the cache's BERTs run without transformers' modeling code, with the same numbers.

The embedding model's hidden states are compared with transformers' `BertModel` of the same folder
(its default attention, SDPA), and the pair model's logits with transformers'
`BertForSequenceClassification` under the same trained tensors, bit for bit, on batches with and
without padding, a pair cut at the pair model's length, and one text alone. (The embedder's vectors
are held to sentence-transformers' in tests/test_sentence_encoder.py.)"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from cache import bert
from cache.embedder import default_embedding_dir
from cache.pair_model import PairModel

TEXTS = ["What is the capital of France?", "hi", "", "Ünïcödé 東京 🚀 naïve café",
         "How do I reset my password if I no longer have the email I signed up with?", "word " * 400]


def test_the_embedding_model_s_hidden_states_are_transformers_bit_for_bit():
    from transformers import AutoModel, AutoTokenizer

    folder = default_embedding_dir()
    theirs = AutoModel.from_pretrained(folder, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    ours = bert.read(folder)
    assert ours is not None and not ours.training
    with torch.inference_mode():
        for batch in (TEXTS, TEXTS[:1], TEXTS[2:4], TEXTS[:2]):  # padded, alone, an empty text, no padding
            features = tokenizer(batch, padding=True, truncation=True, max_length=256, return_tensors="pt")
            expected = theirs(**features).last_hidden_state
            assert torch.equal(ours(**features).last_hidden_state, expected), batch
    assert ours.config.hidden_size == theirs.config.hidden_size == 384


def test_the_pair_model_s_logits_are_transformers_bit_for_bit():
    ours = PairModel.load(threads=1)
    theirs = PairModel.load(threads=1, trainable=True)
    assert isinstance(ours.model, bert.BertForPairScore) and not isinstance(theirs.model, bert.BertForPairScore)
    firsts = [TEXTS[0]] * len(TEXTS)
    assert np.array_equal(ours.raw_logits(firsts, TEXTS), theirs.raw_logits(firsts, TEXTS))
    assert np.array_equal(ours.score(TEXTS[4], TEXTS[:1]), theirs.score(TEXTS[4], TEXTS[:1]))
    same, other = ours.score(TEXTS[0], ["What's France's capital city?", "What is the capital of Spain?"])
    assert same > 0.5 > other, (same, other)  # a trained head, not a fresh one


@pytest.mark.parametrize("change", [{"position_embedding_type": "relative_key"}, {"hidden_act": "relu"},
                                    {"model_type": "roberta"}])
def test_a_folder_of_another_shape_is_left_to_transformers(tmp_path, change):
    folder = tmp_path / "other"
    shutil.copytree(default_embedding_dir(), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    assert bert.read(folder) is None and bert.read_pair_scorer(folder) is None
