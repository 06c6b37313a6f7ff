"""The memory a fine-tune needs on its device, counted before it starts, and the batch that fits.

What a fine-tune holds on its device: the student's training state (its weights, their gradients and Adam's two
moments, and under fairseq's half-precision optimizer a float32 copy of the weights and gradients besides), the
teacher's weights beside it under word-level distillation, and one batch's activations kept for the backward
pass. The activations are counted per token as a Transformer layer keeps them (after Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", section 4.1, in values rather than bytes): an
attention block keeps its input, query, key, value, output and dropout mask (6 d values) and its attention
probabilities with their dropout mask (2 heads x s, s the batch's sequence length); an FFN block its input and
dropout mask (2 d) and its hidden layer before and after the activation with its mask (3 FFN); a decoder layer has
two attention blocks; the output layer keeps the logits, their log-softmax and its gradient (3 x vocabulary per
target token), and the teacher's logits and probabilities besides (2 x vocabulary). On the CPU the process itself
(the interpreter, torch, fairseq, what it holds when the fine-tune starts) is counted as measured then. An
estimate, not a measurement: the allocator's slack comes on top (``HEADROOM``).

Where the checkpoint's batch does not fit, its batches are halved and twice as many accumulated per update (the
update sees as many sentences), down to a batch holding the training split's longest pair; where even that does
not fit, the fine-tune cannot run here.
"""

from dataclasses import dataclass
from typing import Dict

from fairseq_headprune.errors import StudyError
from fairseq_headprune.study.output.serialisation import PlainRecord

# bytes per parameter of the student's training state: weights, gradients, Adam's two moments (float32); in half
# precision fairseq's optimizer keeps float32 copies of the weights and gradients beside the half ones
TRAINING_BYTES_PER_PARAMETER = {"float32": 16, "float16": 20, "bfloat16": 20, "mixed float16 (amp)": 16}
VALUE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "mixed float16 (amp)": 2}  # an activation's bytes
HEADROOM = 0.8  # the share of the device's free memory a fine-tune is planned to use
GB = 1e9


@dataclass(frozen=True)
class TrainingShape:
    """What a fine-tune's memory depends on: its model's sizes (a family without a decoder or without an output
    over the vocabulary has 0 there), the teacher's parameters (0: none beside it) and the precision it trains in
    (``engine.finetune.held.training_precision``)."""

    parameters: int
    teacher_parameters: int
    model_dim: int
    ffn_dim: int
    heads: int
    encoder_layers: int
    decoder_layers: int
    vocabulary: int
    precision: str = "float32"


def batch_values(shape: TrainingShape, tokens: int, length: int) -> float:
    """The activation values one batch of ``tokens`` tokens of sequences ``length`` long keeps (the module)."""
    attention = 6 * shape.model_dim + 2 * shape.heads * length
    ffn = 2 * shape.model_dim + 3 * shape.ffn_dim
    per_token = (shape.encoder_layers * (attention + ffn) + shape.decoder_layers * (2 * attention + ffn)
                 + shape.vocabulary * (3 + (2 if shape.teacher_parameters else 0)))
    return float(tokens) * per_token


def needed_bytes(shape: TrainingShape, tokens: int, length: int) -> Dict[str, float]:
    """The bytes of the student's training state, the teacher's weights and a batch's activations."""
    values = VALUE_BYTES.get(shape.precision, 4)
    return {"student": float(shape.parameters * TRAINING_BYTES_PER_PARAMETER.get(shape.precision, 16)),
            "teacher": float(shape.teacher_parameters * values),
            "batch": batch_values(shape, tokens, min(length, tokens)) * values}


@dataclass
class MemoryPlan(PlainRecord):
    """The fine-tune's memory as planned: the device and its free bytes (per process), the bytes needed at the
    batch chosen, the checkpoint's batch and the one chosen (``tokens``: a batch's tokens, or its sentences where
    the checkpoint batches by sentences) and how many more batches each update accumulates for it."""

    device: str
    free: float
    needed: Dict[str, float]
    unit: str  # "tokens" or "sentences"
    batch: int  # the checkpoint's batch
    chosen: int
    accumulation: int  # 1 where the checkpoint's batch fits

    @property
    def total(self) -> float:
        return sum(self.needed.values())

    def need_text(self) -> str:
        """``the fine-tune needs an estimated 1.20 GB of the CPU's 20.0 GB free (student 0.10, batch 1.10; a
        batch of 4096 tokens)``."""
        parts = ", ".join(f"{name} {_gb(self.needed[name])}" for name in ("process", "student", "teacher",
                                                                               "batch") if self.needed.get(name))
        return (f"the fine-tune needs an estimated {self.total / GB:.2f} GB of the {self.device}'s "
                f"{self.free / GB:.1f} GB free ({parts}; a batch of {self.chosen} {self.unit})")

    def text(self) -> str:
        """``need_text``, and the batch chosen where the checkpoint's did not fit."""
        text = self.need_text()
        if self.accumulation > 1:
            text += (f": the checkpoint's batch of {self.batch} {self.unit} does not fit, so batches of "
                     f"{self.chosen} are trained, {self.accumulation} accumulated for each of its batches")
        return text

def _gb(count: float) -> str:
    """Bytes in GB, to two decimals (three below 0.01)."""
    return f"{count / GB:.2f}" if count >= 0.01 * GB else f"{count / GB:.3f}"


def plan_memory(shape: TrainingShape, device: str, free: float, unit: str, batch: int, longest: int,
                process: float = 0.0) -> MemoryPlan:
    """The largest batch, the checkpoint's ``batch`` halved as often as needed, whose fine-tune fits in
    ``HEADROOM`` of ``free`` bytes, down to the smallest (a batch of tokens must hold the ``longest`` pair; of
    sentences, one), the ``process``'s own bytes counted too; one line (``StudyError``) where none fits."""
    smallest = longest if unit == "tokens" else 1
    chosen, accumulation = batch, 1
    while True:
        tokens = chosen if unit == "tokens" else chosen * longest
        needed = {**({"process": float(process)} if process else {}), **needed_bytes(shape, tokens, longest)}
        plan = MemoryPlan(device, free, needed, unit, batch, chosen, accumulation)
        if plan.total <= HEADROOM * free:
            return plan
        if chosen // 2 < smallest:
            break
        chosen, accumulation = chosen // 2, accumulation * 2
    advice = (" --distill sequence trains without the teacher beside it;" if shape.teacher_parameters else "")
    raise StudyError(f"{plan.need_text()}, over {HEADROOM:.0%} of what is free even at its smallest batch:"
                     f"{advice} free the device or fine-tune on a larger one (--finetune-memory GB sets what it may "
                     "use where the estimate is too cautious)")
