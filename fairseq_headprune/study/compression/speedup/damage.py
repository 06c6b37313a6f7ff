"""A shape's damage before fine-tuning (the plan's ranking of the shapes): its validation loss over the unpruned
model's on the same batches, with its standard error, on a random sample of the Fisher split where that split is
large.

The damage is a ratio of sums over the batches, D = sum(shape loss - unpruned loss) / sum(target tokens); its
standard error is the ratio estimator's with the batches as clusters (Cochran 1977, Sampling Techniques, section
6.3): SE^2 = B / (B - 1) * sum_b (d_b - D n_b)^2 / (sum_b n_b)^2, the paired differences d_b of batch b's summed
losses and n_b its tokens. Where the split holds more than ``DAMAGE_SAMPLE`` sentences (and no
--importance-limit names how many), the plan measures on ``DAMAGE_SAMPLE`` of them drawn at random once, so
that its 150-odd loss passes of a 6 + 6 model cost what that many sentences cost, whatever the split's size.
"""

import math
import random
from typing import List, Optional, Sequence, Tuple

DAMAGE_SAMPLE = 1000  # sentences: the plan's damage sample where the Fisher split is larger
DAMAGE_SAMPLE_SEED = 1  # its draw, the same in every run

# one batch's summed loss and the target tokens it sums over
BatchLoss = Tuple[float, float]


def damage_sample(sentences: int, seed: int = DAMAGE_SAMPLE_SEED) -> Optional[List[int]]:
    """The sentence indices the damage is measured on, sorted: None (every sentence) up to ``DAMAGE_SAMPLE``,
    else ``DAMAGE_SAMPLE`` of the ``sentences`` drawn at random under ``seed``."""
    if sentences <= DAMAGE_SAMPLE:
        return None
    return sorted(random.Random(seed).sample(range(sentences), DAMAGE_SAMPLE))


def paired_damage(shape: Sequence[BatchLoss], unpruned: Sequence[BatchLoss]) -> Tuple[float, Optional[float]]:
    """The damage (the module's D) and its standard error (None with fewer than two batches) from each batch's
    summed loss and tokens under the shape and under the unpruned model, batch for batch."""
    if len(shape) != len(unpruned) or not shape:
        raise ValueError(f"paired_damage needs the same batches under both models, got {len(shape)} and "
                         f"{len(unpruned)}")
    differences = [pruned - base for (pruned, _), (base, _) in zip(shape, unpruned)]
    tokens = [count for _, count in unpruned]
    total = sum(tokens)
    damage = sum(differences) / total
    batches = len(differences)
    if batches < 2:
        return damage, None
    spread = sum((difference - damage * count) ** 2 for difference, count in zip(differences, tokens))
    return damage, math.sqrt(batches / (batches - 1) * spread) / total
