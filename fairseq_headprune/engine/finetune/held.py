"""Fine-tuning a pruned model with its structure held: fairseq-train in this process, on the plugin's task.

The model trains as its checkpoint was trained (architecture, criterion,
optimizer, batch size: the checkpoint's own saved configuration), on this
data's training split, through the head-masking task of its family. It
starts from ``write_masked_start``: the tuning (Kwon et al. 2022, section
4.3) folded into the weights, the pruned heads and neurons masked and
recorded in the model's config, as a checkpoint fine-tuned with
``--head-mask``/``--ffn-mask`` records them. The task gets those masks as
its options: the masked units' outputs are multiplied by 0 and their weights
restored after every step (``tasks.masking``), so the structure the search
chose is the one that trains, and the trained checkpoint records its masks
and shrinks like any masked one. What changes from the saved configuration:
the data and the task, ``--max-update N`` with no epoch limit, a constant
learning rate after a linear warm-up (``FinetuneSettings``), no validation,
one process or ``FinetuneSettings.processes`` of this machine
(``finetune.processes``: fairseq's data-parallel training, each update seeing
as many batches as in one process), the optimizer, scheduler, meters and data
loader reset (``--finetune-from-model``).

Fine-tuning until it is enough (``FinetuneStop``) turns fairseq's own
validation on instead: ``--eval-bleu`` on the stop's split every interval,
``--best-checkpoint-metric bleu --maximize-best-checkpoint-metric`` (the
checkpoint kept is the best one on validation), ``--patience`` and
``--stop-time-hours``; two hooks on fairseq-train's loop, set for the run and
taken off after it (``validation_hooks``), record every validation (the
recovery curve, ``CURVE_FILE``) and stop once the target is reached.
"""

import contextlib
import functools
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import ContextManager, Iterator, List, Optional, Tuple

import torch
from fairseq import checkpoint_utils
from fairseq_cli import train
from omegaconf import open_dict

from fairseq_headprune.constants import (
    CLASSIFIER_FAMILY,
    CLASSIFIER_TASK,
    DEFAULT_LABEL_SMOOTHING,
    LANGUAGE_MODEL_FAMILY,
    LANGUAGE_MODEL_TASK,
    TRANSLATION_TASK,
)
from fairseq_headprune.engine.checkpoints.info import (
    load_checkpoint_state,
    model_config_object,
    state_ffn_layout,
    state_head_layout,
)
from fairseq_headprune.engine.checkpoints.state_dict import fold_tuning_into_state
from fairseq_headprune.engine.finetune.memory import apply_memory_plan, plan_finetune_memory
from fairseq_headprune.engine.finetune.processes import check_processes, set_processes, train_on_processes
from fairseq_headprune.engine.finetune.resume import resumed_seconds
from fairseq_headprune.errors import CheckpointError, StudyError, first_line, library_errors_as
from fairseq_headprune.modules.model_config import FFN_MASK_KEY, HEAD_MASK_KEY, config_value, record_config_value
from fairseq_headprune.registry import register_components
from fairseq_headprune.study.compression.settings import DEFAULT_DISTILL_WEIGHT, WORD_DISTILLATION
from fairseq_headprune.study.finetune.memory import MemoryPlan
from fairseq_headprune.study.finetune.settings import (
    BFLOAT16,
    CHECKPOINT_PRECISION,
    FLOAT16,
    FLOAT32,
    FinetuneSettings,
    FinetuneStop,
    Validation,
    finetune_precision,
    patience_state,
    stop_reason,
)
from fairseq_headprune.study.masks.ffn_mask import NEURONS, FfnMask
from fairseq_headprune.study.masks.head_mask import HEADS, HeadMask, check_mask_layout, head_mask_to_spec
from fairseq_headprune.study.output.files import atomic_path, write_json
from fairseq_headprune.study.search.tuning import read_tuning

# the plugin's head-masking task of each family
FAMILY_TASKS = {CLASSIFIER_FAMILY: CLASSIFIER_TASK, LANGUAGE_MODEL_FAMILY: LANGUAGE_MODEL_TASK}
# ("update", U) or ("epoch", E): where a part of a fine-tune stops (FinetuneSettings.curve_stops)
Stop = Tuple[str, int]
CURVE_FILE = "validations.json"  # in the save directory of a fine-tune until enough: every validation, in order
MEMORY_FILE = "memory.json"  # in the save directory: the fine-tune's memory plan, which a resumed one keeps
NEVER = 10 ** 9  # an epoch interval never reached: validation at update intervals only


@dataclass
class FinetuneOutcome:
    """What ``finetune_held`` trained."""

    checkpoint: str  # the trained checkpoint (masks recorded)
    updates: int
    seconds: float  # this process's, plus what earlier processes trained up to the resume point (resumed_seconds)
    lr: float
    warmup: int
    train_subset: str
    # fine-tuning until enough: every validation ({updates, bleu}), why it stopped, the update count of the
    # checkpoint kept (the best on validation)
    curve: List[Validation] = field(default_factory=list)
    stopped: Optional[str] = None
    kept_updates: Optional[int] = None
    device: str = "cpu"  # where it trained
    precision: str = "float32"  # what it trained in: float32 on a CPU; on a GPU as FinetuneSettings.precision chose
    processes: int = 1  # data-parallel processes (FinetuneSettings.processes)
    update_freq: int = 1  # the batches each process accumulated per update
    memory: Optional[MemoryPlan] = None  # its memory plan


def training_precision(cfg) -> str:
    """The precision fairseq-train computes in under ``cfg`` (its common --amp, --fp16, --bf16 and their
    memory-efficient forms; float32 otherwise)."""
    common = cfg.common
    if getattr(common, "amp", False):
        return "mixed float16 (amp)"
    if common.bf16 or common.memory_efficient_bf16:
        return "bfloat16"
    return "float16" if common.fp16 or common.memory_efficient_fp16 else "float32"


def _precision_here(requested: str, checkpoint_precision: str, cpu: bool) -> str:
    """``finetune_precision`` with this machine's facts: a GPU unless ``cpu``, and whether it computes bfloat16."""
    on_gpu = not cpu and torch.cuda.is_available()
    return finetune_precision(requested, checkpoint_precision, on_gpu, on_gpu and torch.cuda.is_bf16_supported())


def check_finetune_here(settings: FinetuneSettings, cpu: bool, checkpoint: str, data: str, family: str,
                        teacher: Optional[str]) -> None:
    """The fine-tune's precision, processes and memory checked against this machine where a run starts
    (run_compress, run_speedup), so that a precision the device cannot train in, more GPU processes than GPUs, or
    a fine-tune that fits at no batch is refused before any stage runs: its memory as the unpruned ``checkpoint``
    would need it (no fine-tuned shape is larger), ``teacher`` beside it."""
    if not settings.enabled:
        return
    _precision_here(settings.precision, FLOAT32, cpu)
    check_processes(settings.processes, cpu or not torch.cuda.is_available())
    register_components()  # the plugin's tasks, which read the training split
    with tempfile.TemporaryDirectory(prefix="headprune-memory-") as directory:
        cfg, _, _ = training_config(checkpoint, data, directory, family, settings, cpu, False, teacher)
        with library_errors_as(lambda error: StudyError(f"--finetune-updates: cannot read the training split of "
                                                        f"{data}: {first_line(error)}")):
            plan_finetune_memory(cfg, checkpoint, family, teacher, training_precision(cfg), settings.memory_gb,
                                 settings.processes)


def write_masked_start(checkpoint: str, out: str, head_mask: Optional[HeadMask], ffn_mask: Optional[FfnMask],
                       tuning_file: Optional[str] = None) -> None:
    """``checkpoint`` with the tuning's scales and corrections folded in and the pruned units masked: ``head_mask``
    and ``ffn_mask`` (None: not recorded) recorded in its model config as their specs."""
    state = load_checkpoint_state(checkpoint)
    config = model_config_object(state)
    if config is None:
        raise CheckpointError(f"{checkpoint} has no model config (neither cfg nor args)")
    for mask, layout, kind in ((head_mask, state_head_layout, HEADS), (ffn_mask, state_ffn_layout, NEURONS)):
        if mask is not None:
            check_mask_layout(mask, layout(state), kind)
    if tuning_file is not None:
        tuning = read_tuning(tuning_file, state_head_layout(state), state_ffn_layout(state))
        fold_tuning_into_state(state["model"], tuning)
    for key, mask, kind in ((HEAD_MASK_KEY, head_mask, HEADS), (FFN_MASK_KEY, ffn_mask, NEURONS)):
        if mask is not None:
            record_config_value(config, key, head_mask_to_spec(mask, kind))
    state["last_optimizer_state"] = None  # fine-tuning resets the optimizer
    with atomic_path(out) as temporary:
        torch.save(state, temporary)


def training_config(start: str, data: str, save_dir: str, family: str, settings: FinetuneSettings, cpu: bool,
                    progress: bool, teacher: Optional[str] = None, distill_weight: float = DEFAULT_DISTILL_WEIGHT,
                    stop: Optional[Stop] = None):
    """fairseq's training config: the start checkpoint's own, with what the module docstring lists changed
    (``teacher``: the criterion becomes word-level distillation from that checkpoint; ``stop``: train only up to
    that update or epoch of the fine-tune, its learning rate and warm-up those of the whole fine-tune)."""

    state = checkpoint_utils.load_checkpoint_to_cpu(start)
    cfg = state["cfg"]
    lr = settings.learning_rate(float(cfg.optimization.lr[0]))
    warmup = settings.warmup_updates()
    cpu = cpu or not torch.cuda.is_available()
    with open_dict(cfg):
        cfg.task._name = FAMILY_TASKS.get(family, TRANSLATION_TASK)
        cfg.task.data = os.path.abspath(data)
        # the start's recorded masks become the task's options: fairseq-train checks a dataclass model's
        # config (transformer_lm) against its fields; the model built records them again
        for key, option in ((HEAD_MASK_KEY, "head_mask"), (FFN_MASK_KEY, "ffn_mask")):
            cfg.task[option] = config_value(cfg.model, key)
            _forget(cfg.model, key)
        checkpoint = cfg.checkpoint
        checkpoint.save_dir = save_dir
        checkpoint.finetune_from_model = os.path.abspath(start)
        checkpoint.restore_file = "checkpoint_last.pt"
        for flag in ("reset_optimizer", "reset_lr_scheduler", "reset_meters", "reset_dataloader", "no_save",
                     "no_last_checkpoints"):
            checkpoint[flag] = False
        checkpoint.no_epoch_checkpoints = True
        # resumable: checkpoint_last.pt with the optimizer every save_interval updates (fairseq reseeds each update
        # from seed + updates, and restores the data iterator's position, so a resumed run continues the same run)
        # (with --finetune-epochs, checkpoint_last.pt at each epoch's end is the resume point)
        checkpoint.no_save_optimizer_state = not (settings.save_interval or settings.epochs)
        checkpoint.save_interval_updates, checkpoint.keep_best_checkpoints = settings.save_interval, -1
        checkpoint.keep_interval_updates = 2 if settings.save_interval else -1  # one whole if the last is cut
        optimization = cfg.optimization
        max_update, max_epoch = settings.updates, settings.epochs
        if stop is not None:
            max_update, max_epoch = (stop[1], 0) if stop[0] == "update" else (0, stop[1])
        optimization.max_update, optimization.max_epoch, optimization.stop_time_hours = max_update, max_epoch, 0.0
        optimization.lr = [lr]
        if cfg.optimizer is not None and "lr" in cfg.optimizer:
            cfg.optimizer.lr = [lr]
        cfg.lr_scheduler = {"_name": "fixed", "force_anneal": None, "lr_shrink": 0.1, "warmup_updates": warmup,
                            "lr": [lr]}
        if teacher is not None:  # Kim & Rush's word-level distillation, the checkpoint's label smoothing kept
            criterion = cfg.criterion
            cfg.criterion = {
                "_name": WORD_DISTILLATION, "distill_teacher": os.path.abspath(teacher),
                "distill_weight": float(distill_weight),
                "sentence_avg": bool(getattr(criterion, "sentence_avg", False)),
                "label_smoothing": float(getattr(criterion, "label_smoothing", DEFAULT_LABEL_SMOOTHING) or 0.0),
                "ignore_prefix_size": 0, "report_accuracy": False,
            }
        cfg.dataset.disable_validation = True
        if settings.until is not None:
            _validate_until_enough(cfg, settings.until, settings.until.validation_interval(settings.updates))
        cfg.dataset.num_workers = 0
        common = cfg.common
        if settings.seed is not None:  # fairseq draws the batches' order and dropout from it
            common.seed = settings.seed
        common.cpu, common.user_dir, common.log_file = cpu, None, None
        common.tensorboard_logdir, common.wandb_project, common.azureml_logging = None, None, False
        common.log_format = "tqdm" if progress else "none"
        precision = _precision_here(settings.precision, training_precision(cfg), cpu)
        if cpu or settings.precision != CHECKPOINT_PRECISION:  # else its own flags as they are (--amp too)
            common.memory_efficient_fp16 = common.memory_efficient_bf16 = common.amp = False
            common.fp16, common.bf16 = precision == FLOAT16, precision == BFLOAT16
    set_processes(cfg, settings.processes, cpu)
    return cfg, lr, warmup


def _validate_until_enough(cfg, until: FinetuneStop, interval: int) -> None:
    """fairseq's own validation, every ``interval`` updates (and a resume point at each), by BLEU: the best
    checkpoint kept, --patience, --stop-time-hours (``FinetuneStop``)."""
    dataset, checkpoint, task = cfg.dataset, cfg.checkpoint, cfg.task
    dataset.disable_validation, dataset.valid_subset = False, until.subset
    dataset.ignore_unused_valid_subsets = True  # the data's other validation splits (valid1 ...) are not for this
    dataset.validate_interval_updates, dataset.validate_interval, dataset.validate_after_updates = interval, NEVER, 0
    checkpoint.save_interval_updates, checkpoint.keep_interval_updates = interval, 2
    checkpoint.no_save_optimizer_state = False
    checkpoint.best_checkpoint_metric, checkpoint.maximize_best_checkpoint_metric = "bleu", True
    checkpoint.patience = until.patience
    task.eval_bleu, task.eval_bleu_args = True, json.dumps(until.generation)
    task.eval_bleu_detok, task.eval_bleu_detok_args, task.eval_tokenized_bleu = "space", "{}", True
    task.eval_bleu_remove_bpe, task.eval_bleu_print_samples = until.remove_bpe, False
    cfg.optimization.stop_time_hours = 0.0 if until.minutes is None else until.minutes / 60.0


@contextlib.contextmanager
def validation_hooks(until: FinetuneStop, save_dir: str, record: bool = True) -> Iterator[List[Validation]]:
    """Hooks on fairseq-train's loop for fine-tuning until enough, taken off when the run ends: each validation is
    appended to the curve (yielded, and kept in ``save_dir/CURVE_FILE`` where ``record``: on one of several
    processes, whose validations are the same), and the stop check also stops once the target is reached. fairseq
    keeps its --patience state and its best score on two functions of its own; a run that resumes gets them from
    the curve and the checkpoint it resumes from, a new run starts them afresh."""
    curve_file = os.path.join(save_dir, CURVE_FILE)
    last = os.path.join(save_dir, "checkpoint_last.pt")
    resumed = _updates_of(last) if os.path.isfile(last) else None
    # validations after the resume point are done again
    curve = [] if resumed is None else _recorded_curve(save_dir, resumed)
    if resumed is None and hasattr(checkpoint_utils.save_checkpoint, "best"):
        del checkpoint_utils.save_checkpoint.best  # an earlier fine-tune's best, in this process
    validate, should_stop_early = train.validate, train.should_stop_early

    def validating(cfg, trainer, task, epoch_itr, subsets):
        # fairseq's BLEU is a numpy scalar: as a float, the best score it saves in its checkpoints loads anywhere
        losses = [None if loss is None else float(loss) for loss in validate(cfg, trainer, task, epoch_itr, subsets)]
        curve.append(Validation(trainer.get_num_updates(), losses[0]))
        if record:
            write_json([point.to_dict() for point in curve], curve_file)
        return losses

    def stopping(cfg, valid_loss) -> bool:
        if valid_loss is not None and until.target is not None and valid_loss >= until.target:
            return True
        return should_stop_early(cfg, valid_loss)  # fairseq's rule; it keeps its state on ``stopping``

    best, since = patience_state(curve)
    if best is not None:
        stopping.best, stopping.num_runs = best, since
    train.validate, train.should_stop_early = validating, stopping
    try:
        yield curve
    finally:
        train.validate, train.should_stop_early = validate, should_stop_early


def _memory_plan(cfg, start: str, family: str, teacher: Optional[str], settings: FinetuneSettings,
                 save_dir: str) -> MemoryPlan:
    """The fine-tune's memory plan (``engine.finetune.memory``), kept in ``save_dir/MEMORY_FILE``: a fine-tune
    resuming there trains the batch it started with (fairseq resumes an epoch at a count of its batches), whatever
    is free now."""
    path = os.path.join(save_dir, MEMORY_FILE)
    if os.path.isfile(path) and os.path.isfile(os.path.join(save_dir, "checkpoint_last.pt")):
        with open(path, encoding="utf-8") as stream:
            return MemoryPlan.from_dict(json.load(stream))
    plan = plan_finetune_memory(cfg, start, family, teacher, training_precision(cfg), settings.memory_gb,
                                settings.processes)
    os.makedirs(save_dir, exist_ok=True)
    write_json(plan.to_dict(), path)
    return plan


def _rank_context(until: Optional[FinetuneStop], save_dir: str, rank: int) -> ContextManager:
    """What each process of a fine-tune trains inside: the validation hooks of a fine-tune until enough (the curve
    written by the first process), nothing otherwise."""
    return validation_hooks(until, save_dir, record=rank == 0) if until is not None else contextlib.nullcontext()


def _recorded_curve(save_dir: str, updates: int) -> List[Validation]:
    """The validations a fine-tune until enough recorded, up to the ``updates`` its last checkpoint holds (those
    after it, by a process killed before its next save, were lost and done again)."""
    path = os.path.join(save_dir, CURVE_FILE)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as stream:
        curve = [Validation.from_dict(point) for point in json.load(stream)]
    return [point for point in curve if point.updates <= updates]


def _trained_to_the_end(save_dir: str, max_update: int) -> bool:
    """Whether ``save_dir``'s last checkpoint already holds all ``max_update`` updates (a run stopped after its
    training, before its results were written): fairseq-train started on it would take one update more before
    it checks the limit."""
    last = os.path.join(save_dir, "checkpoint_last.pt")
    return max_update > 0 and os.path.isfile(last) and _updates_of(last) >= max_update


def _updates_of(checkpoint: str) -> int:
    """The updates a checkpoint holds, its tensors mapped, not read (a resumed fine-tune asks up to three times)."""
    history = load_checkpoint_state(checkpoint, mmap=True).get("optimizer_history") or [{}]
    return int(history[-1].get("num_updates", 0))


def _forget(model_cfg, key: str) -> None:
    """A key removed from a model config (DictConfig or old-format Namespace)."""
    if hasattr(model_cfg, "pop"):
        model_cfg.pop(key, None)
    elif hasattr(model_cfg, key):
        delattr(model_cfg, key)


def _clear_task_masks(path: str, out: Optional[str] = None, keep_optimizer: bool = True) -> None:
    """The trained checkpoint's task options without the masks (its model config records them), in place or
    into ``out`` (without the optimizer's state unless ``keep_optimizer``).

    Classifiers are loaded with their saved task settings, which would apply
    the masks again once ``shrink`` has removed the units.
    """
    state = load_checkpoint_state(path)
    task = (state.get("cfg") or {}).get("task")
    if task is not None:
        for option in ("head_mask", "ffn_mask"):
            if option in task:
                task[option] = None
    if not keep_optimizer:
        state["last_optimizer_state"] = None
    with atomic_path(out or path) as temporary:
        torch.save(state, temporary)


def save_curve_checkpoint(trained: str, out: str) -> None:
    """A point of the recovery curve: ``trained`` (a fine-tune's last checkpoint, or its masked start) without the
    optimizer's state and with the task's masks cleared, so that it loads and scores as the finished fine-tune
    does (its model config records the masks)."""
    _clear_task_masks(trained, out, keep_optimizer=False)


def finetune_held(start: str, data: str, save_dir: str, family: str, settings: FinetuneSettings, cpu: bool = False,
                  progress: bool = True, teacher: Optional[str] = None,
                  distill_weight: float = DEFAULT_DISTILL_WEIGHT, stop: Optional[Stop] = None) -> FinetuneOutcome:
    """Train ``start`` (``write_masked_start``) for ``settings.updates`` updates with its recorded masks held;
    the last checkpoint in ``save_dir``. ``teacher``: towards that checkpoint's word distributions too
    (``criterions.headprune_word_distillation``). ``stop``: only up to there; called again with a later stop (or
    none), training continues from ``save_dir``'s last checkpoint as one uninterrupted fine-tune would."""
    register_components()
    cfg, lr, warmup = training_config(start, data, save_dir, family, settings, cpu, progress, teacher, distill_weight,
                                      stop)
    earlier = resumed_seconds(save_dir, start)
    began = time.perf_counter()
    def failed(error: BaseException) -> StudyError:
        if isinstance(error, FileNotFoundError):  # fairseq's reader of a missing split
            return StudyError(f"--finetune-updates: cannot train on {data} (split {cfg.dataset.train_subset!r}): "
                              f"{first_line(error)}")
        return StudyError(f"--finetune-updates: fairseq-train failed: {first_line(error)}")

    until = settings.until
    with library_errors_as(failed):
        memory = _memory_plan(cfg, start, family, teacher, settings, save_dir)
        apply_memory_plan(cfg, memory)
        if _trained_to_the_end(save_dir, cfg.optimization.max_update):
            pass
        elif settings.processes > 1:
            train_on_processes(cfg, functools.partial(_rank_context, until, save_dir))
        else:
            with _rank_context(until, save_dir, 0):
                train.main(cfg)
    seconds = earlier + time.perf_counter() - began
    trained = os.path.join(save_dir, "checkpoint_last.pt")
    if not os.path.isfile(trained):
        raise StudyError(f"--finetune-updates: fairseq-train wrote no checkpoint in {save_dir}")
    updates = _updates_of(trained)
    curve = _recorded_curve(save_dir, updates) if until is not None else []
    outcome = FinetuneOutcome(trained, updates, seconds, lr, warmup, str(cfg.dataset.train_subset),
                              device="cpu" if cfg.common.cpu else "cuda", precision=training_precision(cfg),
                              processes=settings.processes, update_freq=int(cfg.optimization.update_freq[0]),
                              memory=memory)
    if until is not None and curve:  # the best checkpoint on validation is the fine-tune's result
        scores = [point.bleu for point in curve]
        outcome.curve, outcome.stopped = list(curve), stop_reason(curve, until, updates, settings.updates)
        # fairseq keeps the last of equal bests
        outcome.kept_updates = curve[len(scores) - 1 - scores[::-1].index(max(scores))].updates
        outcome.checkpoint = os.path.join(save_dir, "checkpoint_best.pt")
    if stop is None:
        _clear_task_masks(outcome.checkpoint)
    return outcome
