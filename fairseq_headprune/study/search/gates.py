"""Hard-concrete head gates (Louizos et al. 2018; Voita et al. 2019) with an exact head budget.

Voita et al. (ACL 2019, "Analyzing Multi-Head Self-Attention") learn a gate
z_h in [0, 1] per head with the hard-concrete distribution: with u ~ U(0, 1),
s = sigmoid((log u - log(1 - u) + log_alpha_h) / beta), stretched to
(gamma, zeta) and clipped to [0, 1], so that z_h is exactly 0 or 1 with
positive probability and P(z_h != 0) = sigmoid(log_alpha_h - beta log(-gamma / zeta))
is differentiable. Instead of Voita et al.'s L0 penalty, whose strength
fixes the number of heads only indirectly, the expected number of open
gates is held to a target t with a Lagrangian, lambda_1 (E[k] - t) +
lambda_2 (E[k] - t)^2, maximised over the multipliers (Wang et al. 2020;
CoFi, Xia et al. 2022; Sheared-LLaMA, Xia et al. 2024). The mask exported
keeps exactly t heads: those with the largest log_alpha (the deterministic
gates' order), as CoFi does. Nothing here depends on fairseq.
"""

import math
from typing import Dict, Optional

import torch

from fairseq_headprune.constants import ATTENTION_TYPES
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.masks.head_mask import HeadLayout, HeadMask

# Louizos et al.'s stretch interval and temperature
GAMMA = -0.1
ZETA = 1.1
BETA = 2.0 / 3.0


def sample_gates(log_alpha: torch.Tensor, beta: float = BETA,
                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One draw of the hard-concrete gates (differentiable in ``log_alpha``)."""
    uniform = torch.rand(log_alpha.shape, generator=generator, dtype=log_alpha.dtype).to(log_alpha.device)
    uniform = uniform.clamp(1e-6, 1 - 1e-6)
    s = torch.sigmoid((torch.log(uniform) - torch.log1p(-uniform) + log_alpha) / beta)
    return (s * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)


def open_probability(log_alpha: torch.Tensor, beta: float = BETA) -> torch.Tensor:
    """P(z_h != 0): the expected contribution of each gate to the number of heads kept."""
    return torch.sigmoid(log_alpha - beta * math.log(-GAMMA / ZETA))


def log_alpha_for_open_probability(probability: float, beta: float = BETA) -> float:
    """The log_alpha at which P(z != 0) is ``probability`` (the inverse of ``open_probability``)."""
    return math.log(probability) - math.log1p(-probability) + beta * math.log(-GAMMA / ZETA)


def deterministic_gates(log_alpha: torch.Tensor) -> torch.Tensor:
    """The gates without noise (Louizos et al.'s test-time estimate)."""
    return (torch.sigmoid(log_alpha) * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)


def parse_target_heads(text: str, total: int) -> int:
    """``--gate-target-heads``: a number of heads or a percentage of the model's, within 1 .. total."""
    stripped = str(text).strip()
    try:
        value = float(stripped[:-1]) * total / 100.0 if stripped.endswith("%") else float(stripped)
    except ValueError:
        raise SettingsError(f"the gate target heads: expected a number of heads or a percentage, got {text!r}",
                            setting="gate_target_heads") from None
    heads = int(math.floor(value + 1e-9))
    if not stripped.endswith("%") and value != heads:
        raise SettingsError(f"the gate target heads: a number of heads must be whole, got {text!r}",
                            setting="gate_target_heads")
    if not 1 <= heads <= total:
        raise SettingsError(f"the gate target heads {text} must keep between 1 and the model's {total} heads",
                            setting="gate_target_heads")
    return heads


def top_k_mask(log_alpha: Dict[str, torch.Tensor], kept: int) -> HeadMask:
    """Exactly ``kept`` heads: those with the largest log_alpha (ties: type, layer, head order)."""
    layout: HeadLayout = {t: tuple(v.shape) for t, v in log_alpha.items()}
    heads = [
        (float(log_alpha[t][layer, head]), ATTENTION_TYPES.index(t), layer, head, t)
        for t in ATTENTION_TYPES if t in log_alpha
        for layer in range(layout[t][0]) for head in range(layout[t][1])
    ]
    total = len(heads)
    if not 0 <= kept <= total:
        raise SettingsError(f"cannot keep {kept} of {total} heads")
    ranked = sorted(heads, key=lambda h: (-h[0], h[1], h[2], h[3]))[:kept]
    head_mask = {t: torch.zeros(shape) for t, shape in layout.items()}
    for _, _, layer, head, t in ranked:
        head_mask[t][layer, head] = 1.0
    return head_mask
