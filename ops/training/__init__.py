"""Offline training: what is learned before serving, never while serving. Distillation of a faster
student from the served model (distill/) and the pair model's fine-tuning, hit-rule tuning and
evaluation (pair_model/). Commands and benchmarks drive it; no runtime package (engine, cache,
workers, gateway, ops.core) imports it, so a worker or a gateway never carries training code
(tests/test_floors.py)."""
