"""A distillation run's history read back: the figures the report gives of it, and its loss curves."""
from __future__ import annotations

from pathlib import Path


def summary(state) -> dict:
    """A run's figures for the report: its length, speed, and its last 20 steps' mean losses."""
    import statistics

    history = state.history
    tail = history[-20:]
    return {"steps": state.step, "seconds": round(state.elapsed_s, 1), "answer_tokens": state.tokens,
            "tok_s_median": statistics.median(r["tok_s"] for r in history) if history else None,
            "teacher_share_median": statistics.median(r["teacher_share"] for r in history) if history else None,
            "final": {k: round(statistics.mean(r[k] for r in tail), 4) for k in ("loss", "hard", "kl")} if tail else None}


def plot_losses(runs: dict[str, list[dict]], path: Path) -> None:
    """Each run's three loss terms by step (smoothed over 10 steps), side by side, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for label, history in runs.items():
        steps = [r["step"] for r in history]
        for ax, key in zip(axes, ("loss", "hard", "kl")):
            ax.plot(steps, _smooth([r[key] for r in history]), label=label)
    for ax, title in zip(axes, ("total loss", "hard term: CE(y, σ(z_s/T))", "soft term: KL(σ(z_t/T) ‖ σ(z_s/T))")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _smooth(values: list[float], window: int = 10) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out
