"""``compress --target speedup=Nx``'s own settings: the search's (``SpeedupSettings``, each field declaring its
option: type, default, choices and help in one place, as fairseq's dataclass configs do) and one attempt's, as
the compress run of that attempt reads it (``AttemptShape``)."""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from fairseq_headprune.study.compression.speedup.shapes import PLAN_MARGIN
from fairseq_headprune.study.masks.layer_drop import LayerChoice
from fairseq_headprune.study.settings import check_one_of, refuse

# how an attempt narrows the layers it keeps: "plan", every layer keeping the shape's width of heads and FFN neurons
# (those of highest Fisher information), the shape the plan timed and whose damage it measured; "search", Kwon et
# al.'s search spending the shape's decoding-FLOPs share across layers and types as the loss estimate prefers
NARROWINGS = ("plan", "search")
# the fine-tuning's learning rate, unless given, is this share of the checkpoint's peak rate (the rate its schedule
# reaches after its warm-up); on the gettext models a tenth of it left two of three decoder layers removed 7 to 12
# BLEU behind where half of it recovered (docs/removal-and-export.md)
SPEEDUP_LR_SHARE = 0.5
# the fine-tuning stops once the decision split's BLEU is within this share of the tolerance of the unpruned
# model's (room for the difference between validation and test)
STOP_SHARE_OF_TOLERANCE = 0.5
# the stages of a speed-up run's own directory, in order (each attempt and the result are compress runs of their own)
SPEEDUP_STAGES = ("halves", "cost", "plan")
OPTION_PREFIX = "with --target speedup: "  # every option's help starts so: it does nothing with another target


def _option(default: Any, help: str, metavar: Optional[str] = None, choices: Optional[tuple] = None,
            default_text: Optional[str] = None, percent: bool = False):
    """A field that declares its command-line option (``compress`` builds the parser from it): ``help`` without
    the default, which is added (``default_text``: in words); ``percent``: the option is given in percent."""
    return field(default=default, metadata={"help": help, "metavar": metavar, "choices": choices,
                                            "default_text": default_text, "percent": percent})


@dataclass(frozen=True)
class SpeedupSettings:
    """The speed-up search of ``compress --target speedup=Nx`` (``engine.pipelines.speedup.run``): the tolerance,
    how many attempts, what an attempt may change, and the split every decision reads."""

    max_bleu_loss: float = _option(1.0, "BLEU points the compressed model may lose against the unpruned one",
                                   metavar="BLEU")
    allow_beam: bool = _option(
        False, "the compressed model may decode at beam 1 or 2 (below fairseq's --beam), its speed and BLEU then "
        "judged against the unpruned model at --beam: after distillation a small beam may keep the BLEU (Kim & Rush "
        "2016)", default_text="the run's beam only")
    decision_subset: str = _option(
        "valid", "the split every decision reads (each attempt's BLEU against the unpruned model's, its speed, when "
        "its fine-tuning stops); --gen-subset is translated once, for the result", metavar="SPLIT",
        default_text="valid; --decision-half keeps it apart from what the Fisher scores, mask tuning and the "
        "fine-tuning read")
    decision_half: bool = _option(
        False, "deal the --decision-subset's sentences alternately into two halves (OUT/halves): the Fisher scores, "
        "the plan's damage, mask tuning and the fine-tuning's validations (its stop and the checkpoint kept) read "
        "the even-numbered ones, every decision the odd-numbered ones, so that no decision reads the sentences its "
        "choices were fitted on", default_text="off: all of them read the whole split, and the score that stopped "
        "the fine-tuning also judges it")
    plan_margin: float = _option(
        PLAN_MARGIN, "the first shape is the least damaged one the plan times this many percent above the target at "
        "every batch size (else the least damaged at the target itself); a smaller margin allows less damaged "
        "shapes and risks an attempt measured just short", metavar="PCT", percent=True)
    narrowing: str = _option(
        "search", "how an attempt narrows the layers it keeps; plan: every layer keeps the shape's share of its "
        "heads and FFN neurons (those of highest Fisher information), the shape the plan timed and measured the "
        "damage of; search: Kwon et al.'s search spends the shape's decoding-FLOPs share where its loss estimate "
        "prefers, which may decode more slowly than the plan timed", choices=NARROWINGS)
    max_attempts: int = _option(3, "compressions tried at most, each a continued fine-tuning or a shape that "
                                "keeps more", metavar="N")

    def __post_init__(self):
        check_one_of(self.narrowing, NARROWINGS, "narrowing")
        refuse(not 0 <= self.plan_margin < 10, f"the plan margin must be 0% or more (below 1000%), got "
               f"{100 * self.plan_margin:g}%", "plan_margin")
        refuse(self.max_bleu_loss < 0, f"the max bleu loss must be 0 or more BLEU points, got {self.max_bleu_loss:g}",
               "max_bleu_loss")
        refuse(self.max_attempts < 1, f"the max attempts must be at least 1, got {self.max_attempts}", "max_attempts")

    def identity(self) -> Dict[str, object]:
        """What makes two speed-up searches the same run. ``max_attempts`` is left out (more attempts continue the
        same sequence, fewer stop it sooner); the margin, the narrowing and the halves where they are the defaults
        (a run's identity from before those options is the same)."""
        defaults = DEFAULT_SPEEDUP
        return {"max_bleu_loss": self.max_bleu_loss, "allow_beam": self.allow_beam,
                "decision_subset": self.decision_subset,
                **({"plan_margin": self.plan_margin} if self.plan_margin != defaults.plan_margin else {}),
                **({"narrowing": self.narrowing} if self.narrowing != defaults.narrowing else {}),
                **({"decision_half": True} if self.decision_half else {})}



DEFAULT_SPEEDUP = SpeedupSettings()


@dataclass(frozen=True)
class AttemptShape:
    """One attempt of a speed-up search, as its compress run reads it: the whole layers the plan chose (None: none
    removed), the share of heads and FFN neurons every kept layer keeps (``--narrowing plan``; None: the search
    spends the decoding-FLOPs share), and the fine-tuned weights it continues from (None: a fresh fine-tuning)."""

    layer_choice: Optional[LayerChoice] = None
    width: Optional[float] = None
    finetune_from: Optional[str] = None
