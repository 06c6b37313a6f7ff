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

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Sequence

from fairseq_headprune.engine.checkpoints.layers import layers_removed, model_depths
from fairseq_headprune.engine.runtime.progress import progress_bar
from fairseq_headprune.engine.search.tuning_guard import LossFunction, mean_loss
from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.masks.layer_drop import LayerDrop, layer_drop_to_spec


@dataclass
class LayerChoice:
    """What ``choose_layers`` removed, and the loss it measured at every step."""

    dropped: LayerDrop
    base_loss: float  # with every layer
    # per step: the stack and layer (1-based, numbered in the full model) removed, the loss after it, and the loss
    # each candidate gave
    steps: List[Dict[str, object]] = field(default_factory=list)

    @property
    def spec(self) -> str:
        return layer_drop_to_spec(self.dropped)

    def to_dict(self) -> Dict[str, object]:
        return {"spec": self.spec, "base_loss": self.base_loss, "steps": self.steps}


def choose_layers(model, loss: LossFunction, samples: Sequence[dict], counts: Mapping[str, int],
                  progress: bool = True) -> LayerChoice:
    """Remove ``counts[stack]`` layers of each stack, one at a time, the one whose removal raises ``loss`` on
    ``samples`` least first."""
    depths = model_depths(model)
    for stack, count in counts.items():
        if stack not in depths:
            raise StudyError(f"the model has no {stack} to remove layers from")
        if count >= depths[stack]:
            raise StudyError(f"cannot remove {count} of the {stack}'s {depths[stack]} layers; it keeps at least one")
    dropped: Dict[str, List[int]] = {stack: [] for stack, count in counts.items() if count > 0}
    model.eval()
    choice = LayerChoice(dropped, mean_loss(model, loss, samples))
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
                    with layers_removed(model, trial):
                        candidates[(stack, layer)] = mean_loss(model, loss, samples)
                    bar.update(1)
            (stack, layer), value = min(candidates.items(), key=lambda item: (item[1], item[0]))
            dropped[stack] = sorted(dropped[stack] + [layer])
            choice.steps.append({"stack": stack, "layer": layer + 1, "loss": value,
                                 "candidates": {f"{s}:{i + 1}": v for (s, i), v in candidates.items()}})
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
