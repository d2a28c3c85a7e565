"""The pair model's training (cache/pair_model.py is the model a gateway serves): labelled pairs and
their splits (pairs.py), generated look-alikes and rewordings (lookalikes.py), fine-tuning
(training.py), the hit rule's operating point (tuning.py) and the offline eval that scores it
(evaluation.py). `brigade cache train-verifier` and `brigade cache eval` (ops/commands/cache.py)
tie it to Redis and the settings."""
