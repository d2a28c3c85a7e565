"""The distillation loss, exactly as the blueprint writes it:

    L = α · CE(y, σ(z_s / T)) + (1 − α) · T² · KL(σ(z_t / T) ‖ σ(z_s / T))

z_s, z_t: the student's and teacher's logits at the answer positions; y: the teacher's sampled
token (the hard label); T: the temperature; α: the weight of the hard-label term. T² keeps the
soft term's gradient on the scale of the hard one's as T grows (Hinton et al., 2015). Both terms
are means over answer tokens. As written, the hard term also divides the student's logits by T
(Hinton's hard term uses T = 1); at T = 1 the two readings agree, and the α = 1 ablation runs
there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LossTerms:
    total: torch.Tensor  # what is minimised
    hard: torch.Tensor  # CE(y, σ(z_s / T)), mean per token
    soft: torch.Tensor  # KL(σ(z_t / T) ‖ σ(z_s / T)), mean per token, before T² and (1 − α)

    def as_floats(self) -> dict[str, float]:
        return {"loss": float(self.total.detach()), "hard": float(self.hard), "kl": float(self.soft)}


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor | None, labels: torch.Tensor,
                      temperature: float, alpha: float) -> LossTerms:
    """[tokens, vocab] logits of the answer positions and their [tokens] labels. `teacher_logits`
    may be None only when α = 1 (hard labels alone need no teacher)."""
    if temperature <= 0:
        raise ValueError(f"the temperature must be above 0, not {temperature}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be between 0 and 1, not {alpha}")
    log_p_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    hard = F.nll_loss(log_p_s, labels)
    if teacher_logits is None:
        if alpha != 1.0:
            raise ValueError("the soft-label term needs the teacher's logits")
        soft = torch.zeros((), device=hard.device)
    else:
        log_p_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
        # KL(p_t ‖ p_s) = Σ p_t (log p_t − log p_s), summed over the vocabulary, averaged over tokens.
        soft = F.kl_div(log_p_s, log_p_t, log_target=True, reduction="batchmean")
    total = alpha * hard + (1.0 - alpha) * temperature ** 2 * soft
    return LossTerms(total, hard.detach(), soft.detach())
