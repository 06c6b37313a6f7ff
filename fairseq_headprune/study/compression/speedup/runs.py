"""The compress runs a speed-up search makes from its own settings: the run on the decision split's halves, each
attempt's (a decoding-FLOPs target with the plan's shape as an ``AttemptShape``) and the result's."""

import dataclasses
from typing import List, Optional

from fairseq_headprune.study.compression.settings import CompressSettings
from fairseq_headprune.study.compression.speedup.settings import AttemptShape
from fairseq_headprune.study.compression.target import CompressTarget
from fairseq_headprune.study.finetune.settings import FinetuneStop
from fairseq_headprune.study.masks.layer_drop import LayerChoice


def attempt_run(run: CompressSettings, flops_share: float, layer_choice: Optional[LayerChoice], out_dir: str,
                finetune_from: Optional[str] = None, beam: Optional[int] = None,
                finetune_lr: Optional[float] = None, finetune_stop: Optional[FinetuneStop] = None,
                width: float = 1.0) -> CompressSettings:
    """A speed-up run's attempt: a compress run in ``out_dir`` removing the whole layers of ``layer_choice`` (the
    plan's) and searching the heads and neurons within ``flops_share`` of the unpruned model's decoding FLOPs,
    evaluated on the decision split; a shape for a smaller ``beam`` is also evaluated and timed there
    (``--speed-beams``). The fine-tuning stops by ``finetune_stop``; a continued one takes the attempt's
    ``finetune_lr``: its default, a share of the start checkpoint's learning rate, would otherwise be a share of
    the fine-tuning's own. With the narrowing plan, every layer keeps the shape's ``width``."""
    search, deployment, finetune = run.speedup, run.deployment, run.finetune
    if finetune_lr is not None:
        finetune = dataclasses.replace(finetune, lr=finetune_lr)
    if finetune_stop is not None and finetune.enabled:
        finetune = dataclasses.replace(finetune, until=finetune_stop)
    if beam is not None and beam not in deployment.beams:
        deployment = dataclasses.replace(deployment, beams=sorted([*deployment.beams, beam]))
    drop_counts = {} if layer_choice is None else {s: len(layers) for s, layers in layer_choice.dropped.items()}
    shape = AttemptShape(layer_choice=layer_choice if drop_counts else None,
                         width=width if search.narrowing == "plan" and width < 1.0 else None,
                         finetune_from=finetune_from)
    return dataclasses.replace(
        run, evaluation=dataclasses.replace(run.evaluation, out_dir=out_dir, gen_subset=search.decision_subset),
        target=CompressTarget("decoding-flops", 100.0 * flops_share), drop_layers=drop_counts, speedup=None,
        attempt=shape, deployment=deployment, finetune=finetune)


def on_halves(run: CompressSettings, data: str, fit: str, decide: str) -> CompressSettings:
    """The speed-up run on the decision split's halves, written in ``data`` beside links to the rest: what read
    the decision split to fit (the Fisher scores, the plan's damage, mask tuning, the fine-tuning's validations)
    reads the ``fit`` half, every decision the ``decide`` half."""
    split = run.speedup.decision_subset

    def fitted(subsets: List[str]) -> List[str]:
        return [fit if subset == split else subset for subset in subsets]

    finetune = run.finetune
    if finetune.until is not None and finetune.until.subset == split:
        finetune = dataclasses.replace(finetune, until=dataclasses.replace(finetune.until, subset=fit))
    return dataclasses.replace(
        run, evaluation=dataclasses.replace(run.evaluation, data=data),
        importance=dataclasses.replace(run.importance, subsets=fitted(run.importance.subsets)),
        tuning=None if run.tuning is None else dataclasses.replace(run.tuning, subsets=fitted(run.tuning.subsets)),
        finetune=finetune, speedup=dataclasses.replace(run.speedup, decision_subset=decide))


def reported_run(run: CompressSettings, attempt: CompressSettings, out_dir: str) -> CompressSettings:
    """An attempt's compressed model evaluated and timed on the speed-up run's own split (the test split, once),
    in ``out_dir``."""
    return dataclasses.replace(attempt, evaluation=dataclasses.replace(
        attempt.evaluation, out_dir=out_dir, gen_subset=run.evaluation.gen_subset))
