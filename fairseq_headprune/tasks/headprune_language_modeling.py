"""The ``headprune_language_modeling`` task: fairseq's language_modeling with per-head masks.

For decoder-only ``transformer_lm`` models: data, targets and
``fairseq-eval-lm`` stay fairseq's own; ``--head-mask`` masks their
self-attention heads, the Dec-Dec type (``D:LAYERS:HEADS``).
"""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

from fairseq_headprune.constants import LANGUAGE_MODEL_TASK
from fairseq_headprune.tasks.masking import FFN_MASK_HELP, HEAD_MASK_HELP, HeadMaskingMixin

TASK_NAME = LANGUAGE_MODEL_TASK


@dataclass
class HeadPruneLanguageModelingConfig(LanguageModelingConfig):
    head_mask: Optional[str] = field(default=None, metadata={"help": HEAD_MASK_HELP})
    ffn_mask: Optional[str] = field(default=None, metadata={"help": FFN_MASK_HELP})


@register_task(TASK_NAME, dataclass=HeadPruneLanguageModelingConfig)
class HeadPruneLanguageModelingTask(HeadMaskingMixin, LanguageModelingTask):
    """Language modeling whose model can mask any self-attention heads."""
