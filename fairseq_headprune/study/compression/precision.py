"""``--quantization auto``: the compute type chosen by measurement, not by what the CPU can run (plain data).

CTranslate2's ``compute_type="auto"`` takes int8 wherever an int8 GEMM
exists, yet int8 is not faster than float32 on every CPU (on some it is much
slower). So the candidates are timed on this machine, each in its own process
(``engine.timing``), and the fastest is kept among those whose BLEU on the
timed sentences is within a tolerance of float32's.
"""

from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Sequence, Tuple

from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.output.serialisation import OMITTED_WHEN_DEFAULT, PlainRecord

AUTO_QUANTIZATION = "auto"
# the compute types tried on each device, float32 (the reference) first
AUTO_CANDIDATES = {"cpu": ("float32", "int8", "int8_float32"),
                   "cuda": ("float32", "float16", "bfloat16", "int8_float16", "int8_bfloat16")}
DEFAULT_QUANTIZATION_TOLERANCE = 0.3  # BLEU points below float32's that a faster type may lose


def auto_candidates(supported: Sequence[str], device: str) -> List[str]:
    """The compute types ``--quantization auto`` times: this device's candidates that CTranslate2 computes here."""
    return [compute_type for compute_type in AUTO_CANDIDATES[device] if compute_type in set(supported)]


@dataclass
class CandidateTiming(PlainRecord):
    """One compute type of the compressed model: its median seconds per batch size and BLEU on the timed sentences."""

    compute_type: str
    seconds: Dict[int, float]  # batch size -> median seconds of one pass
    sentences_per_second: Dict[int, float]
    bleu: float

    ORDER: ClassVar[Tuple[str, ...]] = ("compute_type", "bleu")


@dataclass
class ComputeTypeChoice(PlainRecord):
    """``--quantization auto``'s record: the type chosen, the tolerance it was chosen within, float32's BLEU, the
    chosen type's speed-up over float32 per batch size, the types too inaccurate, every candidate's timing, and the
    sentences timed (``split``, ``sentences``: None, all). ``note``: why nothing was timed (float32 alone)."""

    chosen: str
    tolerance: Optional[float]
    reference_bleu: Optional[float]
    speedup_vs_float32: Optional[Dict[int, float]]
    too_inaccurate: List[str] = field(default_factory=list)
    candidates: List[CandidateTiming] = field(default_factory=list)
    note: Optional[str] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)
    split: Optional[str] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)
    sentences: Optional[int] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)
    vocabulary_map: Optional[bool] = field(default=None, metadata=OMITTED_WHEN_DEFAULT)

    @property
    def chosen_timing(self) -> CandidateTiming:
        return next(c for c in self.candidates if c.compute_type == self.chosen)


def choose_compute_type(candidates: Sequence[CandidateTiming], tolerance: float) -> ComputeTypeChoice:
    """The fastest candidate (least time summed over the batch sizes, each the median of its passes) whose BLEU is at
    least float32's minus ``tolerance``; float32 itself always qualifies."""
    if tolerance < 0:
        raise SettingsError(f"the quantization tolerance must be 0 or more BLEU points, got {tolerance:g}",
                            setting="quantization_tolerance")
    reference = next((c for c in candidates if c.compute_type == "float32"), None)
    if reference is None:
        raise SettingsError("the quantization auto compares every type with float32, which was not timed",
                            setting="quantization")
    kept = [c for c in candidates if c.bleu >= reference.bleu - tolerance - 1e-9]
    chosen = min(kept, key=lambda c: (sum(c.seconds.values()), c.compute_type != "float32"))
    dropped = [c.compute_type for c in candidates if c not in kept]
    speedup = {b: reference.seconds[b] / chosen.seconds[b] for b in chosen.seconds}
    return ComputeTypeChoice(chosen.compute_type, tolerance, reference.bleu, speedup, dropped, list(candidates))


def only_float32_choice(supported: Sequence[str], device: str) -> ComputeTypeChoice:
    """The record when float32 is the only candidate this device computes: nothing to time, float32 is used."""
    return ComputeTypeChoice("float32", None, None, None,
                             note=f"CTranslate2 computes only float32 of {', '.join(AUTO_CANDIDATES[device])} on "
                                  f"{device} ({', '.join(sorted(supported))}): float32 is used, nothing was timed")


def choice_summary(choice: Optional[ComputeTypeChoice]) -> Optional[str]:
    """One line for the console: what was chosen and why, and every candidate's speed and BLEU."""
    if choice is None:
        return None
    if choice.note:
        return choice.note
    batches = ", ".join(str(batch) for batch in choice.speedup_vs_float32)
    if choice.chosen == "float32":
        head = f"float32: no other type is faster within {choice.tolerance:g} BLEU of it"
    else:
        speed = ", ".join(f"{s:.2f}x" for s in choice.speedup_vs_float32.values())
        head = (f"{choice.chosen}: {speed} float32's speed at batch {batches}, BLEU "
                f"{choice.chosen_timing.bleu - choice.reference_bleu:+.2f}")
    timed = "; ".join(
        f"{c.compute_type} " + ", ".join(f"{r:.1f}" for r in c.sentences_per_second.values())
        + f" sent/s, BLEU {c.bleu:.2f}" for c in choice.candidates)
    return f"{head}; timed at batch {batches}: {timed}"
