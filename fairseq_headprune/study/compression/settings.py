"""The ``compress`` command's plan as plain data: its target, its settings and its stages.

From a checkpoint to a deployable model in one run, after Kwon et al. (2022,
"A Fast Post-Training Pruning Framework for Transformers"): Fisher
information of the masks on a validation split, the search for the mask that
keeps the target, mask tuning by least squares, optionally a short
fine-tuning with the pruned units held at zero, real removal (``shrink``),
optionally export to CTranslate2, then the evaluation against the unpruned
model (Koehn's paired bootstrap) and the decoding speed of both.

A target states what the compressed model keeps, as ``search --budget``
does: ``heads=50%`` keeps half of the heads (heads searched),
``flops=50%`` half of the attention and FFN layers' FLOPs per token,
``decoding-flops=50%`` half of their FLOPs per translated sentence in beam
search (``search_costs.decoding_flops_costs``) and
``latency=60%`` 60% of their latency from a table the latency command
measured (heads and FFN neurons searched together). ``speedup=2x`` asks for
decoding twice as fast in CTranslate2 as the unpruned model, both with the
vocabulary map: the shape is chosen from measured candidates and the BLEU
kept within ``--max-bleu-loss`` (``study.compression.speedup``).

Whole layers can go first (``--drop-decoder-layers N``): the layers whose
removal raises the validation loss least (``engine.compression.layer_choice``);
the search then prunes heads and neurons of the shallower model until the
target, still a share of the unpruned model's cost, is met. The fine-tuning
can learn from the unpruned model's translations instead of the references
(``--distill sequence``: sequence-level knowledge distillation, Kim & Rush
2016), as a shallow decoder needs (Kasai et al. 2021).
"""

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from fairseq_headprune.constants import (
    CLASSIFIER_FAMILY,
    CTRANSLATE2_ENGINE,
    MODEL_FAMILIES,
    QUANTIZATIONS,
    TRANSLATION_FAMILY,
)
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.compression.deployment_settings import DeploymentSettings
from fairseq_headprune.study.compression.precision import AUTO_QUANTIZATION, DEFAULT_QUANTIZATION_TOLERANCE
from fairseq_headprune.study.compression.speedup.settings import (
    DEFAULT_SPEEDUP,
    SPEEDUP_STAGES,
    AttemptShape,
    SpeedupSettings,
)
from fairseq_headprune.study.compression.target import LAYER_DROP_TARGETS, SPEEDUP_TARGET, CompressTarget
from fairseq_headprune.study.finetune.settings import FINETUNE_LR_SHARE, FinetuneSettings
from fairseq_headprune.study.search.settings import SearchSettings, TuningSettings
from fairseq_headprune.study.settings import ImportanceSettings, SweepSettings, options_as_settings, refuse

# the stages of a run, in order; each writes one subdirectory of the output directory
STAGES = ("layers", "fisher", "search", "distill", "finetune", "shrink", "export", "evaluate", "speed")
# what --distill learns from (Kim & Rush 2016): the unpruned model's beam outputs on the training sources as the
# targets (sequence), or its distribution over the vocabulary at every target position beside the reference (word)
DISTILL_KINDS = ("sequence", "word")
NO_DISTILL = "none"  # --distill none: fine-tune on the references, where a default would distill
WORD_DISTILLATION = "headprune_word_distillation"  # the criterion of --distill word
DEFAULT_DISTILL_WEIGHT = 0.5  # --distill word: the teacher's share of the loss
# fine-tuning updates compress runs on a translation model unless told otherwise: on the demo model (16,000
# sentence pairs, 49 updates an epoch) a decoding-flops=50% mask translates at 10.45 BLEU before fine-tuning
# and 63.18 after 200 updates (the unpruned model: 62.63), 3.2 minutes on 2 CPU cores; a shallower decoder
# needs more (docs/removal-and-export.md). Classifiers and language models: none unless asked.
DEFAULT_TRANSLATION_FINETUNE_UPDATES = 200
# versions of the run record (OUT/compress.json) and of the report (OUT/report.json)
COMPRESS_FORMAT = "fairseq-headprune compress 1"


def default_finetune_updates(family: str) -> int:
    """The fine-tuning compress runs when ``--finetune-updates`` is not given (see
    ``DEFAULT_TRANSLATION_FINETUNE_UPDATES``)."""
    return DEFAULT_TRANSLATION_FINETUNE_UPDATES if family == TRANSLATION_FAMILY else 0


def default_distill(target_kind: str, finetune_updates: int) -> Optional[str]:
    """``--distill`` when not given: word-level for ``--target speedup=Nx`` (its fast shapes remove whole decoder
    layers: on the gettext models, fine-tuning on the teacher's translations left them 7 to 12 BLEU behind where
    the word-level loss, given more updates at a higher rate, kept it (docs/removal-and-export.md); the teacher
    runs beside the student, so where it does not fit, ``--distill sequence``); none for the other targets."""
    return "word" if target_kind == SPEEDUP_TARGET and finetune_updates > 0 else None


@dataclass
class CompressSettings:
    """``compress``: checkpoint to compressed (and exported) model, evaluated against the unpruned one.

    ``evaluation`` holds the data, the split, the metric, the significance
    test and fairseq's generation options; its checkpoint is the unpruned
    model and its output directory the run's.
    """

    evaluation: SweepSettings
    target: CompressTarget
    importance: ImportanceSettings = field(
        default_factory=lambda: ImportanceSettings(method="fisher")
    )
    tuning: Optional[TuningSettings] = field(default_factory=TuningSettings)  # None: --no-tune
    latency_table: Optional[str] = None
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)
    export_format: Optional[str] = None  # None: no export
    quantization: Optional[str] = None  # None: float32; "auto": chosen by timing (precision_choice)
    quantization_tolerance: float = DEFAULT_QUANTIZATION_TOLERANCE  # auto: BLEU a faster type may lose
    deployment: DeploymentSettings = field(default_factory=DeploymentSettings)
    tuning_skipped: Optional[str] = None  # why the tuning (on by default) does not run on this model
    # one head count per stack (with export to CTranslate2: the decoder's types together); None: on exactly when
    # exporting to CTranslate2, which pads every layer to its stack's largest head count
    uniform: Optional[bool] = None
    # translation exported to CTranslate2: a vocabulary map exported too and the compressed model timed with it
    # (None: on exactly then)
    vocabulary_map: Optional[bool] = None
    drop_layers: Dict[str, int] = field(default_factory=dict)  # stack -> whole layers removed before the search
    distill: Optional[str] = None  # None: fine-tune on the references; "sequence": on the unpruned model's outputs;
    # "word": towards its word distributions too, with this share of the loss
    distill_weight: float = DEFAULT_DISTILL_WEIGHT
    # --target speedup=Nx: the search (None: its defaults; another target: refused unless None)
    speedup: Optional[SpeedupSettings] = None
    # one attempt of a speed-up search: this run compresses to its shape (None: a run of its own)
    attempt: Optional[AttemptShape] = None

    def __post_init__(self):
        family = self.evaluation.family
        self.drop_layers = {stack: int(count) for stack, count in self.drop_layers.items() if count}
        self._check_speedup()
        for stack, count in self.drop_layers.items():
            if count < 0:
                raise SettingsError(f"the {stack} layers to drop must be 0 or more, got {count}",
                                    setting=f"drop_{stack}_layers")
        if self.drop_layers and self.target.kind not in LAYER_DROP_TARGETS:
            stack = next(iter(self.drop_layers))
            raise SettingsError(f"the {stack} layers to drop with the target {self.target.text}: a latency table is "
                                "timed on the full model's layers; use "
                                f"{' or '.join(k + '=' for k in LAYER_DROP_TARGETS)}",
                                setting=(f"drop_{stack}_layers", "target"))
        if self.distill is not None:
            if self.distill not in DISTILL_KINDS:
                raise SettingsError(f"the distill {self.distill}: expected one of {', '.join(DISTILL_KINDS)}",
                                    setting="distill")
            if family != TRANSLATION_FAMILY:
                raise SettingsError("the distill sequence learns from the unpruned model's translations: "
                                    "it goes with a translation model", setting="distill")
            if not self.finetune.enabled:
                raise SettingsError("the distill goes with fine-tuning (the finetune updates N)",
                                    setting=("distill", "finetune_updates"))
        refuse(not 0.0 <= self.distill_weight <= 1.0,
               f"the distill weight must be between 0 and 1, got {self.distill_weight:g}", "distill_weight")
        if self.distill_weight != DEFAULT_DISTILL_WEIGHT and self.distill != "word":
            raise SettingsError("the distill weight is the teacher's share of the loss of the distill word",
                                setting=("distill_weight", "distill"))
        if family not in MODEL_FAMILIES:
            raise SettingsError(f"unknown model family {family!r} (expected {', '.join(MODEL_FAMILIES)})")
        if self.uniform is None:
            self.uniform = self.export_format == CTRANSLATE2_ENGINE
        elif not self.uniform and self.target.kind == "latency" and self.export_format == CTRANSLATE2_ENGINE:
            raise SettingsError("the uniform off: a latency target for the export ctranslate2 is priced by a table "
                                "of whole stacks, one head count per stack; leave the uniform on",
                                setting=("uniform", "export"))
        if self.deployment.beams and family != TRANSLATION_FAMILY:
            raise SettingsError("the speed beams: beam sizes are a translation model's; this checkpoint is a "
                                f"{family}", setting="speed_beams")
        exported_translation = self.export_format == CTRANSLATE2_ENGINE and family == TRANSLATION_FAMILY
        if self.vocabulary_map is None:
            self.vocabulary_map = exported_translation
        elif self.vocabulary_map and not exported_translation:
            raise SettingsError("the vocabulary map goes with a translation model exported to CTranslate2 "
                                "(the export ctranslate2)", setting=("vocabulary_map", "export"))
        if self.target.kind == "decoding-flops" and family != TRANSLATION_FAMILY:
            raise SettingsError(f"the target {self.target.text} prices a translation model's beam search; this is "
                                f"a {family.replace('_', ' ')}: use flops=", setting="target")
        if self.latency_table is not None and self.target.kind != "latency":
            raise SettingsError("the latency table goes with a latency target (the target latency=P%)",
                                setting=("latency_table", "target"))
        if self.export_format is not None:
            if family == CLASSIFIER_FAMILY:
                raise SettingsError(f"the export {self.export_format}: a classifier cannot be exported to "
                                    "CTranslate2, which runs translation models and generators (language models); "
                                    "leave out the export", setting="export")
        if self.quantization is not None:
            if self.export_format is None:
                raise SettingsError("the quantization is the exported model's weight type: it goes with the export",
                                    setting=("quantization", "export"))
            if self.quantization not in (*QUANTIZATIONS, AUTO_QUANTIZATION):
                raise SettingsError(f"the quantization {self.quantization}: expected one of "
                                    f"{', '.join((*QUANTIZATIONS, AUTO_QUANTIZATION))}", setting="quantization")
            if self.quantization == AUTO_QUANTIZATION and family != TRANSLATION_FAMILY:
                raise SettingsError("the quantization auto chooses by the exported translation model's decoding "
                                    "speed and BLEU; a language model's export is not timed: name a type",
                                    setting="quantization")
        refuse(self.quantization_tolerance < 0, "the quantization tolerance must be 0 or more BLEU points, got "
               f"{self.quantization_tolerance:g}", "quantization_tolerance")
        if self.importance.method != "fisher":
            raise SettingsError("the search ranks by Fisher scores: estimate them with the importance method fisher",
                                setting="importance_method")
        if self.target.structure != "heads":  # the joint search needs the neurons' scores too
            self.importance = dataclasses.replace(self.importance, neurons=True)
        # an attempt is judged on the decision split, its own choice
        if self.tuning is not None and self.attempt is None:
            self.tuning.refuse_evaluation_split(self.evaluation.gen_subset)

    def _check_speedup(self) -> None:
        if self.target.kind != SPEEDUP_TARGET:
            refuse(self.speedup is not None, "the speed-up search's settings go with the target speedup=Nx", "target")
            return
        if self.speedup is None:
            self.speedup = DEFAULT_SPEEDUP
        if self.speedup.decision_subset == self.evaluation.gen_subset:
            raise SettingsError(f"the decision subset {self.speedup.decision_subset} is the split the result is "
                                "reported on (the gen subset): decide on another, e.g. valid",
                                setting=("decision_subset", "gen_subset"))
        refuse(self.speedup.decision_subset.startswith("test"), f"the decision subset {self.speedup.decision_subset}: "
               "decisions are made on validation data, never on a test split", "decision_subset")
        if self.evaluation.family != TRANSLATION_FAMILY:
            raise SettingsError(f"the target {self.target.text} is a translation model's decoding speed in "
                                f"CTranslate2; this checkpoint is a {self.evaluation.family.replace('_', ' ')}",
                                setting="target")
        if self.export_format != CTRANSLATE2_ENGINE:
            raise SettingsError(f"the target {self.target.text} is measured in CTranslate2: use the export "
                                "ctranslate2", setting=("target", "export"))
        if self.drop_layers:
            raise SettingsError(f"the target {self.target.text} chooses the layers to remove from measured shapes; "
                                "leave out the layers to drop", setting=("target", "drop_layers"))
        if self.latency_table is not None:
            raise SettingsError(f"the target {self.target.text} times its candidates itself; leave out the latency "
                                "table", setting=("target", "latency_table"))
        if self.quantization == AUTO_QUANTIZATION:
            raise SettingsError(f"the target {self.target.text} is measured at one compute type; name it "
                                "(the quantization float32, int8 ...)", setting=("target", "quantization"))

    def search_settings(self, checkpoint: str, work: str, **options) -> SearchSettings:
        """The search of this run, on ``checkpoint`` (the unpruned model, or it without whole layers)."""
        evaluation, target = self.evaluation, self.target
        return SearchSettings(
            data=self.data, checkpoint=checkpoint, out_dir=work, budget=target.budget, cost=target.cost,
            importance=self.importance, tuning=self.tuning, family=self.family, cpu=evaluation.cpu,
            progress=evaluation.progress, fairseq_args=list(evaluation.generation_args), structure=target.structure,
            **options)

    @property
    def table_quantization(self) -> str:
        """The compute type a CTranslate2 latency table is timed at: float32 when the type is chosen after the
        search (``auto``)."""
        return "float32" if self.quantization in (None, AUTO_QUANTIZATION) else self.quantization

    @property
    def shape(self) -> AttemptShape:
        """The speed-up attempt's shape this run compresses to; an empty one for a run of its own."""
        return self.attempt or AttemptShape()

    @property
    def data(self) -> str:
        return self.evaluation.data

    @property
    def checkpoint(self) -> str:
        return self.evaluation.checkpoint

    @property
    def out_dir(self) -> str:
        return self.evaluation.out_dir

    @property
    def family(self) -> str:
        return self.evaluation.family

    @property
    def stages(self) -> Tuple[str, ...]:
        """The stages this run goes through."""
        if self.target.kind == SPEEDUP_TARGET:  # the attempts are compress runs of their own
            return SPEEDUP_STAGES if self.speedup.decision_half else SPEEDUP_STAGES[1:]
        skipped = set()
        if not self.finetune.updates:
            skipped.add("finetune")
        if not self.drop_layers:
            skipped.add("layers")
        if self.distill != "sequence" or "finetune" in skipped:
            skipped.add("distill")
        if self.export_format is None:
            skipped.add("export")
        return tuple(s for s in STAGES if s not in skipped)

    def _finetune_identity(self) -> Dict[str, object]:
        """The fine-tuning's settings, the stop rule, the learning-rate share and the seed only where they are not
        the defaults of a fixed-length fine-tune (an older run's identity is unchanged)."""
        identity = dataclasses.asdict(self.finetune)
        # how the arithmetic runs, like the device: each fine-tune's record states it
        del identity["precision"], identity["processes"], identity["memory_gb"]
        if identity["until"] is None:
            del identity["until"]
        else:  # the data counted is a measurement of the data the run names, not a setting
            del identity["until"]["data"]
        if identity["lr_share"] == FINETUNE_LR_SHARE:
            del identity["lr_share"]
        if identity["seed"] is None:
            del identity["seed"]
        return identity

    def identity(self) -> Dict[str, object]:
        """What makes two runs the same run, stage by stage (the checkpoint's and table's hashes come from the
        engine)."""
        evaluation, shape = self.evaluation, self.shape
        importance = dataclasses.asdict(self.importance)
        return {
            "format": COMPRESS_FORMAT,
            "family": self.family,
            "data": os.path.abspath(self.data),
            "checkpoint": os.path.abspath(self.checkpoint),
            "fairseq_args": options_as_settings(evaluation.generation_args),  # the same options in any order
            "fisher": importance,
            "search": {"target": self.target.text, "structure": self.target.structure, "cost": self.target.cost,
                       "latency_table": os.path.abspath(self.latency_table) if self.latency_table else None,
                       "tuning": None if self.tuning is None else dataclasses.asdict(self.tuning),
                       "tuning_skipped": self.tuning_skipped, "uniform": self.uniform,
                       **({"width": shape.width} if shape.width is not None else {})},
            **({"layers": dict(self.drop_layers)} if self.drop_layers else {}),
            **({"layers_chosen": shape.layer_choice.spec} if shape.layer_choice is not None else {}),
            "finetune": ({**self._finetune_identity(), **({"distill": self.distill} if self.distill else {}),
                          **({"distill_weight": self.distill_weight} if self.distill == "word" else {}),
                          **({"continued_from": os.path.abspath(shape.finetune_from)} if shape.finetune_from else {})}
                         if self.finetune.updates else None),
            **({"speedup": self.speedup.identity()} if self.speedup is not None else {}),
            **({"planned": True} if self.attempt is not None else {}),
            "export": None if self.export_format is None else {
                "format": self.export_format, "quantization": self.quantization or "float32",
                "vocabulary_map": self.vocabulary_map,
                **({"quantization_tolerance": self.quantization_tolerance}
                   if self.quantization == AUTO_QUANTIZATION else {})},
            "evaluate": {"split": evaluation.gen_subset, **evaluation.metric_record(),
                         "test": evaluation.test.to_dict()},
            "speed": self.deployment.to_dict(),
        }
