"""What ``compress --target speedup=Nx`` will cost, known before its long stages start: a few measurements on the
hardware at hand (``CostProbe``, the ``cost/`` stage: one export, one timed pass, one loss pass, a few sentences
decoded, a few fine-tune updates) and what they make of each stage's minutes and disk (``stage_costs``).

Every rule is stated beside its figure (``StageCost.rule``). Where a figure depends on the shape the plan has
not chosen yet, the unpruned model stands in for it (an upper bound); once the plan has chosen, the estimate is
made again from the chosen shape's decoding-FLOPs share and its measured speed-up, but for the fine-tune, whose
student computes as the unpruned model does (``_finetune_cost``).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from fairseq_headprune.study.compression.records import StageRecord
from fairseq_headprune.study.finetune.memory import MemoryPlan

# the share of a decoding pass that no shape removes (beam bookkeeping, embeddings, the output projection): on the
# four documented d = 128 models the plan's fastest shapes left 15 to 32% of the unpruned model's time
FIXED_TIME_SHARE = 0.25
# Fisher information: one forward and one backward pass, about three forward passes' work
FISHER_PASSES = 3
# an attempt's evaluation translates the decision split with the unpruned model, the compressed model and the
# pruned model before fine-tuning
EVALUATED_MODELS = 3
ADAM_STATE = 3  # a checkpoint with Adam's state: the weights and their two moments
# the fine-tune's peak disk: its start, checkpoint_last.pt and the two interval checkpoints with the optimizer's
# state (``engine.finetune.held``), and the best one
FINETUNE_CHECKPOINTS = (1, ADAM_STATE, ADAM_STATE, ADAM_STATE, 1)


@dataclass
class CostProbe(StageRecord):
    """``cost/``: what one unit of each stage's work took on this machine, and how many units the run holds."""

    shape_shares: List[float] = field(default_factory=list)  # each shape the plan exports: its decoding-FLOPs share
    # per shape (its index as text): each of its candidates' beam over the run's (1.0 at the run's beam)
    beams: Dict[str, List[float]] = field(default_factory=dict)
    group: int = 0  # shapes exported and timed together
    repeats: int = 0
    screen_rounds: int = 0  # the rounds every shape is timed first (0: a probe written before: all at repeats)
    factor: float = 0.0  # the speed-up asked for (0: a probe written before it was recorded)
    shortfall: float = 0.0  # a shape is timed again where screened within this share of the factor
    batch_sizes: List[int] = field(default_factory=list)
    export_seconds: float = 0.0  # one export of the unpruned model with the vocabulary map
    export_bytes: int = 0
    worker_seconds: float = 0.0  # starting one timing process and loading its model
    pass_seconds: Dict[int, float] = field(default_factory=dict)  # one timed pass at each batch size
    plan_sentences: int = 0  # the sentences one timed pass decodes
    loss_seconds: float = 0.0  # one validation-loss pass over the damage sentences
    loss_passes: int = 0  # the plan's layer choice and damage: loss passes
    decode_seconds: float = 0.0  # fairseq's beam search, per sentence, with the run's generation options
    # the same at each speed batch size (empty: a probe written before, decode_seconds stands in)
    fairseq_seconds: Dict[int, float] = field(default_factory=dict)
    decoded: int = 0  # the sentences that measured it
    decision_sentences: int = 0
    extra_reference_sentences: int = 0  # the fine-tuning's own validation split's, where it is another
    report_sentences: int = 0  # the --gen-subset's
    speed_sentences: int = 0  # the speed stage's, per batch size
    speed_systems: int = 4  # fairseq and exported (with the vocabulary map too: 6), unpruned and compressed
    weights_bytes: int = 0  # a checkpoint of the model's weights alone
    update_seconds: Optional[float] = None  # one fine-tune update (the unpruned model as the student)
    start_seconds: Optional[float] = None  # a fine-tune's start and end (loading data and models, saving)
    distilled: bool = False  # the updates ran the teacher too (--distill word)
    ceiling: int = 0  # the fine-tune's ceiling in updates
    validations: int = 0  # its validations up to the ceiling
    validation_rule: str = ""  # why they come every so many updates (FinetuneStop.interval_rule)
    updates_per_epoch: int = 0  # of the fine-tuning's training split (0: not counted)
    minutes_cap: Optional[float] = None  # --finetune-minutes
    max_attempts: int = 1
    memory: Optional[MemoryPlan] = None  # the fine-tune's memory plan

    def __post_init__(self):
        self.pass_seconds = {int(batch): float(value) for batch, value in (self.pass_seconds or {}).items()}
        self.fairseq_seconds = {int(batch): float(value) for batch, value in (self.fairseq_seconds or {}).items()}


@dataclass
class StageCost:
    """One stage's expected seconds and the most disk it holds at once, with the rule that made them."""

    stage: str
    seconds: float
    disk_bytes: int
    rule: str
    at_most: bool = False  # an upper bound (the fine-tune's ceiling, or the unpruned model standing in)


@dataclass
class ChosenShape:
    """What the plan knows of the shape an attempt compresses to: its decoding-FLOPs share and its speed-up."""

    flops_share: float
    slowest_speedup: float


def time_share(flops_share: float) -> float:
    """A shape's decoding time over the unpruned model's from its FLOPs share (``FIXED_TIME_SHARE`` stays)."""
    return FIXED_TIME_SHARE + (1.0 - FIXED_TIME_SHARE) * flops_share


def layer_choice_passes(depths: Mapping[str, int], layer_counts: Sequence[Mapping[str, int]]) -> int:
    """The loss passes ``engine.compression.layer_choice.choose_layers`` makes for these shapes' layer counts
    with one cache: each step tries every layer left in each stack not yet at its count; the layers it removes
    are taken as the lowest-numbered ones (the count of distinct trials does not depend on which)."""
    seen = {frozenset()}
    for counts in layer_counts:
        dropped: Dict[str, List[int]] = {stack: [] for stack, count in counts.items() if count > 0}
        for _ in range(sum(counts.values())):
            trials = []
            for stack, layers in dropped.items():
                if len(layers) == counts[stack]:
                    continue
                for layer in range(depths[stack]):
                    if layer not in layers:
                        key = frozenset((s, x) for s, v in dropped.items() for x in v) | {(stack, layer)}
                        seen.add(key)
                        trials.append((stack, layer))
            stack, layer = min(trials)
            dropped[stack].append(layer)
    return len(seen)


def _group_timing(probe: CostProbe, shapes: Sequence[int], rounds: int) -> float:
    """The seconds of timing ``shapes`` (indices) in groups of ``probe.group`` beside the unpruned model (with and
    without its map), each system started once per group, ``1 + rounds`` rounds (a warm-up and ``rounds``)."""
    seconds, size = 0.0, probe.group or 1
    for start in range(0, len(shapes), size):
        group = shapes[start:start + size]
        systems = [2.0] + [time_share(probe.shape_shares[i]) * sum(probe.beams.get(str(i), [1.0])) for i in group]
        processes = 2 + sum(len(probe.beams.get(str(i), [1.0])) for i in group)
        seconds += processes * probe.worker_seconds + (1 + rounds) * sum(systems) * sum(probe.pass_seconds.values())
    return seconds


def _plan_cost(probe: CostProbe) -> StageCost:
    shares = probe.shape_shares
    everyone = list(range(len(shares)))
    # a probe written before the plan screened (screen_rounds 0) times every shape at --repeats
    screen = probe.screen_rounds if 0 < probe.screen_rounds < probe.repeats else probe.repeats
    timing = _group_timing(probe, everyone, screen)
    exports = probe.export_seconds * (1.0 + sum(shares))
    refined: List[int] = []
    if screen < probe.repeats:
        # which shapes are timed again is known once screened and their damage measured: those this rule of the
        # FLOPs expects within the shortfall of the target stand in (the damage order leaves out more)
        near = probe.factor * (1.0 - probe.shortfall)
        refined = [i for i in everyone if 1.0 / time_share(shares[i]) >= near]
        timing += _group_timing(probe, refined, probe.repeats)
        exports += probe.export_seconds * sum(shares[i] for i in refined)
    damage = probe.loss_seconds * (FISHER_PASSES + probe.loss_passes)
    reference = probe.decode_seconds * (probe.decision_sentences + probe.extra_reference_sentences)
    groups = [shares[start:start + (probe.group or 1)] for start in range(0, len(shares), probe.group or 1)]
    largest = max((sum(group) for group in groups), default=0.0)
    disk = int(probe.export_bytes * (1.0 + largest))
    groups_text = (f"{len(groups)} groups of up to {probe.group} shapes timed {1 + screen} rounds at batch "
                   f"{' and '.join(str(b) for b in probe.batch_sizes)}")
    if refined:
        groups_text += (f", then the {len(refined)} of them expected within {probe.shortfall:.0%} of "
                        f"{probe.factor:g}x again at {1 + probe.repeats} rounds")
    rule = (f"{len(shares) + 1 + len(refined)} exports of up to {_size(probe.export_bytes)} at "
            f"{probe.export_seconds:.3g} s each; {groups_text} ({_seconds(sum(probe.pass_seconds.values()))} per "
            f"round of the unpruned model); {probe.loss_passes} loss passes and the Fisher information at "
            f"{probe.loss_seconds:.1f} s a pass; {probe.decision_sentences + probe.extra_reference_sentences} "
            f"sentences translated at {probe.decode_seconds:.3g} s each")
    return StageCost("plan", exports + timing + damage + reference, disk, rule, at_most=bool(refined))


def _finetune_cost(probe: CostProbe) -> Optional[StageCost]:
    """The fine-tune at its ceiling, the unpruned model's update and decoding rates standing in for the student's
    whatever shape the plan chose: the student keeps its narrowed heads and neurons, held at zero by hooks, and
    its validations decode in fairseq, not in the export engine. On the demo model the chosen shape (half its
    layers removed, the rest at 75% width) took 326.6 s for 441 updates and 9 validations, against 0.555 s an
    update probed with the unpruned student (docs/compress.md)."""
    if probe.update_seconds is None or not probe.ceiling:
        return None
    seconds = (probe.start_seconds or 0.0) + probe.ceiling * probe.update_seconds \
        + probe.validations * probe.decision_sentences * probe.decode_seconds
    capped = probe.minutes_cap is not None and seconds > 60.0 * probe.minutes_cap
    if capped:
        seconds = 60.0 * probe.minutes_cap
    disk = int(probe.weights_bytes * sum(FINETUNE_CHECKPOINTS))
    epochs = (f" ({probe.ceiling / probe.updates_per_epoch:.3g} epochs of the training split)"
              if probe.updates_per_epoch else "")
    rule = (f"at most {probe.ceiling} updates{epochs} at {probe.update_seconds:.3g} s"
            + (" with the teacher" if probe.distilled else "")
            + f" (the unpruned model as the student), {probe.validations} validations of "
            f"{probe.decision_sentences} sentences" + (f", {probe.validation_rule}" if probe.validation_rule else "")
            + (f", capped at {probe.minutes_cap:g} minutes (--finetune-minutes)" if capped else "")
            + "; it stops earlier once within the tolerance")
    return StageCost("finetune", seconds, disk, rule, at_most=True)


def _speed_seconds(probe: CostProbe, sentences: int, chosen: Optional[ChosenShape]) -> float:
    """The speed stage: every system started once and each batch size decoded ``1 + repeats`` times; fairseq at
    its per-sentence time at each batch size, the compressed model too (fairseq's beam search costs per step what
    it costs: on the demo model the shrunk model took 0.52 and 0.61 of the unpruned one's time at batch 1 and 64,
    where the plan timed its export at 1 / 2.75), the exports at the plan's."""
    compressed = 1.0 if chosen is None else 1.0 / max(chosen.slowest_speedup, 1e-9)
    exported = sum(seconds / max(probe.plan_sentences, 1) for seconds in probe.pass_seconds.values())
    fairseq = sum(probe.fairseq_seconds.get(batch, probe.decode_seconds) for batch in probe.batch_sizes)
    variants = max(probe.speed_systems - 2, 1) / 2.0  # each model exported, with its vocabulary map too
    per_round = sentences * (2.0 * fairseq + variants * exported * (1.0 + compressed))
    return probe.speed_systems * probe.worker_seconds + (1 + probe.repeats) * per_round


def _measure_costs(probe: CostProbe, sentences: int, chosen: Optional[ChosenShape], name: str) -> List[StageCost]:
    compressed = 1.0 if chosen is None else 1.0 / max(chosen.slowest_speedup, 1e-9)
    evaluate = probe.decode_seconds * sentences * (1.0 + (EVALUATED_MODELS - 1) * compressed)
    speed = _speed_seconds(probe, min(sentences, probe.speed_sentences or sentences), chosen)
    return [StageCost(f"{name} evaluate", evaluate, 0,
                      f"{sentences} sentences translated by {EVALUATED_MODELS} models at {probe.decode_seconds:.3g} s "
                      "each" + (" (the unpruned model's rate)" if chosen is None else
                                ", the compressed ones at the plan's speed-up"), at_most=chosen is None),
            StageCost(f"{name} speed", speed, 0,
                      f"{probe.speed_systems} systems, {1 + probe.repeats} rounds of "
                      f"{min(sentences, probe.speed_sentences or sentences)} sentences at batch "
                      f"{' and '.join(str(b) for b in probe.batch_sizes)}" + _fairseq_rates(probe),
                      at_most=True)]


def _fairseq_rates(probe: CostProbe) -> str:
    """``; fairseq at 0.06 and 0.007 s a sentence``: its probed rate at each batch size, where measured."""
    if not probe.fairseq_seconds:
        return ""
    rates = " and ".join(f"{probe.fairseq_seconds.get(b, probe.decode_seconds):.3g}" for b in probe.batch_sizes)
    return f"; fairseq at {rates} s a sentence"


def stage_costs(probe: CostProbe, chosen: Optional[ChosenShape] = None) -> List[StageCost]:
    """The plan's cost (before it has run), one attempt's and the result's: see the module."""
    costs = [] if chosen is not None else [_plan_cost(probe)]
    fisher = StageCost("attempt fisher", probe.loss_seconds * FISHER_PASSES, 0,
                       f"{FISHER_PASSES} loss passes' work")
    exports = StageCost("attempt export", probe.export_seconds * (1.0 + (1.0 if chosen is None else
                                                                         chosen.flops_share)),
                        int(probe.export_bytes * 2), "the unpruned and the compressed model exported")
    costs += [fisher]
    finetune = _finetune_cost(probe)
    if finetune is not None:
        costs.append(finetune)
    costs += [exports, *_measure_costs(probe, probe.decision_sentences, chosen, "attempt"),
              *_measure_costs(probe, probe.report_sentences, chosen, "result")]
    return costs


def attempt_disk_bytes(probe: CostProbe, chosen: Optional[ChosenShape] = None) -> int:
    """What an attempt's directory keeps: its fine-tuned checkpoint with Adam's state, the pruned start and the
    removed model, and both exports."""
    student = 1.0 if chosen is None else chosen.flops_share
    return int(probe.weights_bytes * (ADAM_STATE + 2 * student) + 2 * probe.export_bytes)


def totals(costs: Sequence[StageCost]) -> Tuple[float, float, float]:
    """The plan's seconds, one attempt's and the result's."""
    plan = sum(c.seconds for c in costs if c.stage == "plan")
    attempt = sum(c.seconds for c in costs if c.stage.startswith("attempt") or c.stage == "finetune")
    result = sum(c.seconds for c in costs if c.stage.startswith("result"))
    return plan, attempt, result


def cost_lines(probe: CostProbe, costs: Sequence[StageCost], chosen: Optional[ChosenShape] = None) -> List[str]:
    """The console's estimate: one line per stage and one for the whole run (one attempt, and each further one)."""
    lines = [f"{cost.stage}\t{'at most ' if cost.at_most else ''}{_seconds(cost.seconds)}"
             + (f", {_size(cost.disk_bytes)} of disk at once" if cost.disk_bytes else "") + f" ({cost.rule})"
             for cost in costs]
    plan, attempt, result = totals(costs)
    peak = max((c.disk_bytes for c in costs), default=0) + attempt_disk_bytes(probe, chosen)
    first = plan + attempt + result
    lines.append(f"in all\t{'' if chosen is None else 'from here '}{_seconds(first)} with one attempt, each further "
                 f"attempt (at most {probe.max_attempts}) {_seconds(attempt)} more; about {_size(peak)} of disk, "
                 f"{_size(attempt_disk_bytes(probe, chosen))} kept per attempt")
    if probe.memory:
        lines.append(f"memory\t{probe.memory.text()}")
    return lines


def _seconds(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60.0
    if minutes < 90:
        return f"{minutes:.1f} min"
    return f"{int(minutes // 60)} h {int(round(minutes % 60)):02d} min"


def _size(count: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"
