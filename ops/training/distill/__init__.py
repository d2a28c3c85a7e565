"""Knowledge distillation: a smaller student built from the served model (student.py), the
teacher's answers as data (corpus.py), the blueprint's loss (loss.py), training with
checkpoints (trainer.py) and held-out measures (evaluation.py). Knows nothing of Redis or the
registry; `brigade distill` (ops/commands/distill.py) ties it to them."""
