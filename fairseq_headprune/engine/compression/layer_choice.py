"""Which whole layers a model misses least: greedy removal by the measured validation loss.

Head and neuron masks are chosen by their Fisher scores, a second-order
estimate of the loss a mask adds (Kwon et al. 2022). A whole layer is too
large a change for that estimate, and there are few of them, so each
candidate is measured: the teacher-forced loss with the layer left out, as
fairseq's ``--*-layers-to-keep`` builds the model. The layer whose removal
raises the loss least goes first, and the next is chosen with it removed
(the shallow decoder of Kasai et al. 2021 is then fine-tuned, preferably
distilled from the unpruned model).
"""

from typing import Dict, FrozenSet, List, Mapping, MutableMapping, Optional, Sequence, Tuple

from fairseq_headprune.engine.checkpoints.layers import layers_removed, model_depths
from fairseq_headprune.engine.runtime.progress import progress_bar
from fairseq_headprune.engine.search.tuning_guard import LossFunction, mean_loss
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.masks.layer_drop import LayerChoice, LayerStep

# the losses measured so far, by the layers left out: several choices on one model share them
LossCache = MutableMapping[FrozenSet[Tuple[str, int]], float]


def choose_layers(model, loss: LossFunction, samples: Sequence[dict], counts: Mapping[str, int],
                  progress: bool = True, cache: Optional[LossCache] = None) -> LayerChoice:
    """Remove ``counts[stack]`` layers of each stack, one at a time, the one whose removal raises ``loss`` on
    ``samples`` least first. ``cache``: the losses of earlier choices on the same model and samples, read and
    added to (a loss depends only on the layers left out)."""
    cache = {} if cache is None else cache

    def loss_without(dropped: Mapping[str, List[int]]) -> float:
        key = frozenset((stack, layer) for stack, layers in dropped.items() for layer in layers)
        if key not in cache:
            with layers_removed(model, dropped):
                cache[key] = mean_loss(model, loss, samples)
        return cache[key]

    depths = model_depths(model)
    for stack, count in counts.items():
        if stack not in depths:
            raise StudyError(f"the model has no {stack} to remove layers from")
        if count >= depths[stack]:
            raise StudyError(f"cannot remove {count} of the {stack}'s {depths[stack]} layers; it keeps at least one")
    dropped: Dict[str, List[int]] = {stack: [] for stack, count in counts.items() if count > 0}
    model.eval()
    choice = LayerChoice(dropped, loss_without({}))
    total = sum(counts.values())
    with progress_bar(None, passes_left(depths, counts, dropped), "loss without each layer", progress) as bar:
        for _ in range(total):
            bar.total = bar.n + passes_left(depths, counts, dropped)  # exact once the stacks' order is known
            bar.refresh()
            candidates = {}
            for stack, layers in dropped.items():
                if len(layers) == counts[stack]:
                    continue
                for layer in range(depths[stack]):
                    if layer in layers:
                        continue
                    trial = {s: sorted(v + [layer]) if s == stack else v for s, v in dropped.items()}
                    candidates[(stack, layer)] = loss_without(trial)
                    bar.update(1)
            (stack, layer), value = min(candidates.items(), key=lambda item: (item[1], item[0]))
            dropped[stack] = sorted(dropped[stack] + [layer])
            choice.steps.append(LayerStep(stack, layer + 1, value,
                                          {f"{s}:{i + 1}": v for (s, i), v in candidates.items()}))
    return choice


def passes_left(depths: Mapping[str, int], counts: Mapping[str, int], dropped: Mapping[str, List[int]]) -> int:
    """The losses ``choose_layers`` has still to measure, at most: every step measures each layer left in every stack
    still losing layers, and the stacks stay in the running longest when they lose their layers in turn."""
    left = {stack: counts[stack] - len(layers) for stack, layers in dropped.items()}
    kept = {stack: depths[stack] - len(layers) for stack, layers in dropped.items()}
    passes = 0
    while any(left.values()):
        passes += sum(kept[stack] for stack in left if left[stack])
        stack = max(left, key=lambda name: (left[name], name))
        left[stack] -= 1
        kept[stack] -= 1
    return passes
