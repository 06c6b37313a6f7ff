"""Head importance of an encoder-only classifier or a decoder-only language model.

I_h = E_x |dL(x)/dxi_h| (Michel et al. 2019, section 4.1, as they estimate it
for BERT on MNLI). For a classifier (fairseq ``sentence_prediction``) L is
the checkpoint's own ``sentence_prediction`` criterion: cross-entropy over
the classes, or the squared error of a regression target. For a language
model (``language_modeling``) L(x) is the summed next-token cross-entropy of
sample x (fairseq's ``cross_entropy`` criterion; a sentence with
``--sample-break-mode eos``). Each example gets its own mask variables (one
(layers, examples, heads) tensor of ones that requires grad), so one backward
pass of the summed loss gives every example's dL(x)/dxi at once: examples do
not interact in these models.
"""

import contextlib

import torch

from fairseq_headprune.constants import CLASSIFIER_FAMILY, DEFAULT_IMPORTANCE_METHOD
from fairseq_headprune.engine.runners.batches import collated_samples
from fairseq_headprune.engine.runtime.progress import progress_bar
from fairseq_headprune.engine.runtime.ranks import current_ranks
from fairseq_headprune.errors import StudyError
from fairseq_headprune.modules.masked_ffn import current_ffn_mask, ffn_layout, ffn_mask_applied
from fairseq_headprune.modules.masked_multihead_attention import current_head_mask, head_layout, head_mask_applied
from fairseq_headprune.study.importance.scores import ImportanceResult, gradient_magnitude
from fairseq_headprune.study.settings import ImportanceSettings


def example_importance(model, criterion, samples, layout, method: str = DEFAULT_IMPORTANCE_METHOD,
                       progress: bool = False, description: str = "importance", neurons: bool = False):
    """Sum over examples of |dL(x)/dxi_h| (``fisher``: its square), a (layers, heads) float64 tensor, the count,
    the sum of g g^T over each layer's heads ((layers, heads, heads): the Fisher blocks, whatever the method),
    and with ``neurons`` the same sums for every FFN neuron's zeta_i per FFN type (else None).

    The model has one attention type (Enc-Enc for a classifier, Dec-Dec for an LM).
    Under several ranks each takes every world_size-th batch and the sums
    are added over the ranks in rank order (as ``translation_importance.estimate_importance``
    does for translation), so every rank returns the whole sums.
    """
    (attention_type,) = layout
    layers, heads = layout[attention_type]
    base = current_head_mask(model)
    base_mask = torch.ones(layers, heads) if base is None else base[attention_type]
    total = torch.zeros(layers, heads, dtype=torch.float64)
    blocks = torch.zeros(layers, heads, heads, dtype=torch.float64)
    base_neurons = current_ffn_mask(model) or {}
    neuron_layout = ffn_layout(model) if neurons else {}
    neuron_totals = {t: torch.zeros(shape, dtype=torch.float64) for t, shape in neuron_layout.items()}
    count = 0
    ranks = current_ranks()
    samples = ranks.share(list(samples))
    for sample in progress_bar(samples, len(samples), description, progress):
        examples = sample["nsentences"]
        device = next(model.parameters()).device
        xi = base_mask.to(device).unsqueeze(1).repeat(1, examples, 1).requires_grad_()
        zeta = {t: base_neurons.get(t, torch.ones(shape)).to(device).unsqueeze(1).repeat(1, examples, 1)
                   .requires_grad_()
                for t, shape in neuron_layout.items()}  # per FFN type: layers x examples x neurons
        with head_mask_applied(model, {attention_type: xi}), \
                (ffn_mask_applied(model, zeta) if zeta else contextlib.nullcontext()):
            loss, _, _ = criterion(model, sample)
            model.zero_grad()
            loss.backward()
        for ffn_type, mask in zeta.items():
            neuron_totals[ffn_type] += gradient_magnitude(mask.grad.detach().double().cpu(), method).sum(dim=1)
        gradients = xi.grad.detach().double().cpu()  # layers x examples x heads
        total += gradient_magnitude(gradients, method).sum(dim=1)
        blocks += gradients.transpose(1, 2) @ gradients
        count += examples
    if ranks.sharded:
        shares = ranks.gather((total, count, blocks, neuron_totals))
        total, count, blocks = (sum(share[i] for share in shares) for i in range(3))
        neuron_totals = {t: sum(share[3][t] for share in shares) for t in neuron_totals}
    if count == 0:
        raise StudyError("no examples to estimate importance on")
    return total, count, blocks, (neuron_totals or None)


class ExampleImportanceEstimator:
    """I_h of a classifier or LM under any mask, with the estimation samples batched once.

    The counterpart of ``translation_importance.ImportanceEstimator`` (translation) for
    ``prune``'s importance orders and the importance command.
    """

    def __init__(self, family: str, task, model, criterion, settings: ImportanceSettings):
        kind = "a classifier" if family == CLASSIFIER_FAMILY else "a language model"
        if settings.granularity != "sentence":
            raise StudyError(f"the importance granularity {settings.granularity}: {kind} is scored per example here; "
                             "use sentence", setting="importance_granularity")
        if settings.loss != "nll":
            raise StudyError(f"the importance loss: {kind} is scored with its own criterion's loss; drop it",
                             setting="importance_loss")
        self.task, self.model, self.criterion, self.settings = task, model, criterion, settings
        self.layout = head_layout(model)
        self.samples = collated_samples(task, model, settings.subsets, settings.max_tokens,
                                        settings.max_sentences or 32, settings.limit)

    def estimate(self, head_mask=None, progress: bool = True, description: str = "importance") -> ImportanceResult:
        """Importance with ``head_mask`` set (None: the model's own mask); sentence level."""
        with head_mask_applied(self.model, head_mask) if head_mask is not None else contextlib.nullcontext():
            total, count, blocks, neurons = example_importance(
                self.model, self.criterion, self.samples, self.layout, self.settings.method, progress, description,
                neurons=self.settings.neurons)
        attention_type = next(iter(self.layout))
        return ImportanceResult(
            importance={attention_type: (total / count).float()}, granularity="sentence", count=count,
            method=self.settings.method,
            fisher_blocks={attention_type: blocks / count} if self.settings.method == "fisher" else None,
            neuron_importance=None if neurons is None else {t: (v / count).float() for t, v in neurons.items()},
            settings={
                "subsets": list(self.settings.subsets), "sentences": count, "limit": self.settings.limit,
                # the criterion's cross-entropy (over classes, or next tokens), or a regression's squared error
                "loss": "mse" if getattr(self.task.cfg, "regression_target", False) else "nll",
                "criterion": self.criterion.__class__.__name__, "task": self.task.__class__.__name__,
                "torch": torch.__version__,
            },
        )
