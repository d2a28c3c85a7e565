"""The cache's embedding model encoded with transformers alone (cache/sentence_encoder.py): the
same vectors as sentence-transformers bit for bit, in batches and one at a time, truncation and
odd text included; a folder of another shape goes through sentence-transformers; and loading the
default one never imports sentence-transformers or scikit-learn (a third of a gateway's start)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from cache import sentence_encoder
from cache.embedder import Embedder, default_embedding_dir

ROOT = Path(__file__).resolve().parent.parent


def texts() -> list[str]:
    # 40 pairs and their answers: 120 texts of every length the cache meets, 2 batches of 64.
    rows = [json.loads(x) for x in (ROOT / "ops" / "data" / "chat_pairs_test.jsonl").read_text().splitlines()[:40]]
    said = [t for r in rows for t in (r["q1"], r["q2"], r.get("answer") or "")]
    odd = ["", " ", "a", "  leading and trailing  ", "Ünïcödé 東京 🚀 naïve café", "line one\nline two\ttab",
           "word " * 400]  # the last past the 256 word pieces the model reads: cut as sentence-transformers cuts
    return said + odd


def test_the_default_model_is_encoded_as_sentence_transformers_encodes_it_bit_for_bit(embedder):
    assert isinstance(embedder.encoder, sentence_encoder.MeanPooledEncoder)
    theirs = sentence_encoder.SentenceTransformersEncoder(default_embedding_dir())
    every = texts()
    assert np.array_equal(embedder.embed(every), theirs.encode(every, 64))
    for text in every[:5] + every[-7:]:  # one at a time: the gateway's lookup
        assert np.array_equal(embedder.embed_one(text), theirs.encode([text], 64)[0]), text
    assert embedder.max_seq_length == theirs.max_seq_length == 256 and embedder.dim == theirs.dim == 384
    assert embedder.token_counts(every[-3:]) == [len(r) for r in theirs.tokenizer(
        every[-3:], add_special_tokens=True, truncation=True, max_length=256)["input_ids"]]


def test_a_folder_of_another_shape_goes_through_sentence_transformers(tmp_path):
    folder = tmp_path / "cls-pooled"
    shutil.copytree(default_embedding_dir(), folder)
    pooling = folder / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    config.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    pooling.write_text(json.dumps(config))
    assert sentence_encoder.read(folder) is None
    assert isinstance(Embedder(folder).encoder, sentence_encoder.SentenceTransformersEncoder)


def test_loading_the_cache_models_imports_no_sentence_transformers_scikit_learn_or_model_code():
    """The embedder and the pair model as a gateway loads them: neither sentence-transformers nor
    transformers' modeling (cache/bert.py runs both BERTs)."""
    heavy = ("sentence_transformers", "sklearn", "transformers.modeling_utils", "transformers.models.auto.modeling_auto",
             "transformers.models.bert.modeling_bert")
    script = ("import sys\nfrom cache.embedder import Embedder\nfrom cache.pair_model import PairModel\n"
              "e = Embedder(threads=1)\ne.embed_one('hello')\nPairModel.shared().score('hi', ['hello'])\n"
              f"print(sorted(m for m in sys.modules if m in {heavy!r} or m.split('.')[0] in {heavy!r}))")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("[]"), out.stdout
