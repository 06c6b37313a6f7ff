"""The three families of models the studies take, behind one interface, so that no study branches on the family.

- translation (encoder-decoder, ``translation`` / ``fairseq-headprune``):
  beam search and BLEU; importance through the ``headprune_importance``
  criterion (Michel et al. section 4.1);
- classifier (RoBERTa-family ``sentence_prediction``): accuracy or
  Matthews correlation; importance per example through the checkpoint's
  own criterion (as the paper does for BERT on MNLI);
- language model (``transformer_lm``, ``language_modeling``): perplexity;
  importance per sample of the summed next-token cross-entropy.

A study asks ``family_of_checkpoint`` (or ``family_named``) for its family
and then only calls the methods below.
"""

from typing import Dict, Optional, Sequence

from fairseq.criterions.cross_entropy import CrossEntropyCriterion

from fairseq_headprune.constants import CLASSIFIER_FAMILY, LANGUAGE_MODEL_FAMILY, MODEL_FAMILIES, TRANSLATION_FAMILY
from fairseq_headprune.engine.checkpoints.info import checkpoint_family
from fairseq_headprune.engine.checkpoints.loading import (
    load_evaluation_model,
    load_generation_model,
    load_with_saved_task,
)
from fairseq_headprune.engine.importance.examples import ExampleImportanceEstimator
from fairseq_headprune.engine.importance.translation import ImportanceEstimator
from fairseq_headprune.engine.search.tuning_guard import criterion_loss
from fairseq_headprune.engine.sweeps.scored_sweep import ScoredSplitSweep
from fairseq_headprune.engine.sweeps.translation_sweep import SplitSweep
from fairseq_headprune.errors import SettingsError
from fairseq_headprune.modules.masked_multihead_attention import current_head_mask, head_layout, set_head_mask
from fairseq_headprune.study.masks.head_mask import HeadMask, check_mask_layout, combine_masks, count_masked
from fairseq_headprune.study.settings import ImportanceSettings, SweepSettings


class ModelFamily:
    """What a study needs of a family of models: loading, importance and a sweep of one split."""

    name: str

    def load(self, data: str, checkpoint: str, fairseq_args: Sequence[str] = (), cpu: bool = False):
        """(cfg, task, model) as the family's fairseq command loads it for evaluation."""
        raise NotImplementedError

    def load_for_importance(self, data: str, checkpoint: str, head_mask: Optional[HeadMask] = None,
                            fairseq_args: Sequence[str] = (), cpu: bool = False):
        """(cfg, task, model) to estimate importance on, with ``head_mask`` (a mask of the model as loaded) added to
        its own mask."""
        raise NotImplementedError

    def importance_estimator(self, cfg, task, model, settings: ImportanceSettings):
        """An estimator of I_h (or F_h) on fixed batches; ``.estimate``, ``.criterion``, ``.samples``, ``.layout``."""
        raise NotImplementedError

    def open_split_sweep(self, settings: SweepSettings, cfg, task, model, split: str, name: str,
                         references: Optional[str] = None):
        """The resumable sweep of one split under many masks, scored in the family's metric."""
        raise NotImplementedError

    def tuning_loss(self, cfg, task):
        """The loss mask tuning's held-aside guard measures (None: the target tokens' cross-entropy)."""
        return None

    # what compress asks of a family

    speed_unit = "examples"  # what the speed tables count
    times_exported_models = False  # whether the unpruned model is exported too, as the exported speed's reference

    def evaluation_record(self, scores) -> Dict[str, object]:
        """What an evaluation records beyond the metric, per model (``scores``: model name -> ConfigScores)."""
        return {}


class TranslationFamily(ModelFamily):
    name = TRANSLATION_FAMILY
    speed_unit = "sentences"
    times_exported_models = True

    def load(self, data, checkpoint, fairseq_args=(), cpu=False):
        return load_generation_model(data, checkpoint, fairseq_args, cpu=cpu)

    def load_for_importance(self, data, checkpoint, head_mask=None, fairseq_args=(), cpu=False):
        cfg, task, model = self.load(data, checkpoint, fairseq_args, cpu)
        if head_mask is not None:
            check_mask_layout(head_mask, head_layout(model))
            set_head_mask(model, combine_masks(current_head_mask(model), head_mask))
        return cfg, task, model

    def importance_estimator(self, cfg, task, model, settings):
        return ImportanceEstimator(task, model, settings)

    def open_split_sweep(self, settings, cfg, task, model, split, name, references=None):
        return SplitSweep(settings, cfg, task, model, split, name, references)

    def evaluation_record(self, scores):
        return {"bleu_tokenized": {name: s.bleu for name, s in scores.items()},
                "bleu_sacrebleu": {name: s.sacrebleu for name, s in scores.items()}}


class _ScoredFamily(ModelFamily):
    """Classifiers and language models: each example scored on its own (no search), importance per example."""

    def load(self, data, checkpoint, fairseq_args=(), cpu=False):
        return load_evaluation_model(self.name, data, checkpoint, fairseq_args, cpu=cpu)

    def load_for_importance(self, data, checkpoint, head_mask=None, fairseq_args=(), cpu=False):
        cfg, task, model = load_with_saved_task(self.name, data, checkpoint, cpu=cpu)
        if head_mask is not None:  # as the task adds a mask to the recorded one: set where it masks a head
            check_mask_layout(head_mask, head_layout(model))
            combined = combine_masks(current_head_mask(model), head_mask)
            if count_masked(combined):
                set_head_mask(model, combined)
        return cfg, task, model

    def criterion(self, cfg, task):
        """The loss importance differentiates."""
        raise NotImplementedError

    def importance_estimator(self, cfg, task, model, settings):
        return ExampleImportanceEstimator(self.name, task, model, self.criterion(cfg, task), settings)

    def open_split_sweep(self, settings, cfg, task, model, split, name, references=None):
        return ScoredSplitSweep(settings, cfg, task, model, split, name)


class ClassifierFamily(_ScoredFamily):
    name = CLASSIFIER_FAMILY

    def criterion(self, cfg, task):
        """The classifier's own criterion (as the paper differentiates BERT's MNLI loss)."""
        return task.build_criterion(cfg.criterion)

    def tuning_loss(self, cfg, task):
        return criterion_loss(self.criterion(cfg, task))


class LanguageModelFamily(_ScoredFamily):
    name = LANGUAGE_MODEL_FAMILY

    def criterion(self, cfg, task):
        """The summed next-token cross-entropy."""
        return CrossEntropyCriterion(task, sentence_avg=False)


_FAMILIES = {family.name: family for family in (TranslationFamily(), ClassifierFamily(), LanguageModelFamily())}


def family_named(name: str) -> ModelFamily:
    if name not in _FAMILIES:
        raise SettingsError(f"unknown model family {name!r} (expected {', '.join(MODEL_FAMILIES)})")
    return _FAMILIES[name]


def family_of_checkpoint(path: str) -> ModelFamily:
    """The family of the model in ``path``, from the task that trained it (an unknown one is an error)."""
    return family_named(checkpoint_family(path))
