"""The ``headprune_sentence_prediction`` task: fairseq's sentence_prediction with per-head masks.

For encoder-only models (RoBERTa and its family, classification heads
included) fine-tuned with ``--task sentence_prediction``: the data, the
classification head and the criterion (``--criterion sentence_prediction``,
which reports accuracy, and Matthews correlation with ``--report-mcc``) stay
fairseq's own; ``--head-mask`` masks Enc-Enc heads (Michel et al. 2019,
section 3, BERT on MNLI).
"""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.tasks import register_task
from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask

from fairseq_headprune.constants import CLASSIFIER_TASK
from fairseq_headprune.tasks.masking import FFN_MASK_HELP, HEAD_MASK_HELP, HeadMaskingMixin

TASK_NAME = CLASSIFIER_TASK


@dataclass
class HeadPruneSentencePredictionConfig(SentencePredictionConfig):
    head_mask: Optional[str] = field(default=None, metadata={"help": HEAD_MASK_HELP})
    ffn_mask: Optional[str] = field(default=None, metadata={"help": FFN_MASK_HELP})


@register_task(TASK_NAME, dataclass=HeadPruneSentencePredictionConfig)
class HeadPruneSentencePredictionTask(HeadMaskingMixin, SentencePredictionTask):
    """Sentence (pair) classification or regression whose model can mask any attention heads."""

    cfg: HeadPruneSentencePredictionConfig
