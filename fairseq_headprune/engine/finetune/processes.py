"""fairseq-train on several processes of this machine: fairseq's own data-parallel training (its
``distributed_main``: each rank trains on its shard of every update's batches, the gradients summed across the
ranks), the processes started here, one per GPU (NCCL) or on the CPU (gloo).

fairseq starts processes itself only for GPUs (``call_main`` spawns one per visible GPU); this starts N processes
on either, each running fairseq's ``distributed_main`` with the rank and a local rendezvous, and the training's
context (the validation hooks of a fine-tune until enough) entered in each. On the CPU the gradients are summed by
fairseq's ``legacy_ddp`` (PyTorch's DDP takes device ids only for GPU modules).
"""

import contextlib
import math
import re
import socket
from typing import Callable, ContextManager, Optional

import torch
from omegaconf import open_dict

from fairseq_headprune.errors import StudyError

CPU_BACKEND, GPU_BACKEND = "gloo", "nccl"
ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit): ")


def per_process_update_freq(update_freq: int, processes: int) -> int:
    """The batches each of ``processes`` accumulates per update so that an update sees as many batches as one
    process accumulating ``update_freq`` does; at least one each, so that below ``processes`` batches per update
    an update sees ``processes`` batches."""
    return max(1, math.ceil(update_freq / processes))


def set_processes(cfg, processes: int, cpu: bool) -> None:
    """fairseq-train's config for ``processes`` data-parallel processes on this machine (1: one process, as
    fairseq-train runs without a launcher): the world size, the backend and its gradient reduction, and each
    process's update frequency (``per_process_update_freq``). The rank and the rendezvous are set when they
    start (``train_on_processes``)."""
    distributed = cfg.distributed_training
    with open_dict(cfg):
        distributed.distributed_world_size = distributed.distributed_num_procs = processes
        distributed.nprocs_per_node = processes
        distributed.distributed_rank, distributed.device_id, distributed.distributed_init_method = 0, 0, None
        distributed.distributed_no_spawn = True
        distributed.distributed_backend = CPU_BACKEND if cpu else GPU_BACKEND
        distributed.ddp_backend = "legacy_ddp" if cpu and processes > 1 else "pytorch_ddp"
        # each process reads the checkpoint from this machine's disk: fairseq's broadcast of it from the first
        # would unpickle its config with torch.load's full pickle, which torch_load's allow-list keeps refused
        cfg.checkpoint.load_checkpoint_on_all_dp_ranks = processes > 1
        optimization = cfg.optimization
        optimization.update_freq = [per_process_update_freq(int(freq), processes) for freq in optimization.update_freq]


def check_processes(processes: int, cpu: bool) -> None:
    """On a GPU each process trains on one of its own: refused where the machine has fewer."""
    if not cpu and torch.cuda.device_count() < processes:
        raise StudyError(f"--finetune-processes {processes}: this machine has {torch.cuda.device_count()} GPU(s), "
                         "and on the GPU each process trains on one of its own (--cpu trains on the CPU)")


def _raised(traceback: str) -> str:
    """The error a process's traceback (as ``spawn`` reports it) ends in: its last ``Type: message`` line."""
    lines = [line.strip() for line in traceback.strip().splitlines() if line.strip()]
    raised = [line for line in lines if ERROR_LINE.match(line)]
    return (raised or lines or ["no message"])[-1]


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_main(rank: int, cfg, context: Callable[[int], ContextManager], threads: int) -> None:
    """One process of ``train_on_processes``: fairseq's distributed main at ``rank``, inside ``context(rank)``."""
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli import train

    import fairseq_headprune.compat.torch_load  # noqa: F401  (fairseq broadcasts checkpoints through torch.load)
    from fairseq_headprune.registry import register_components

    register_components()
    torch.set_num_threads(threads)
    with open_dict(cfg):
        cfg.distributed_training.distributed_rank = rank
    with context(rank):
        distributed_utils.distributed_main(rank, train.main, cfg, {})


def train_on_processes(cfg, context: Callable[[int], ContextManager], threads: Optional[int] = None) -> None:
    """fairseq-train under ``cfg`` (``set_processes``) on its world size of processes started here, each inside
    ``context(rank)`` (a picklable callable: each process enters its own); returns once all have finished.
    ``threads``: the CPU threads the processes share (default this process's)."""
    processes = int(cfg.distributed_training.distributed_world_size)
    check_processes(processes, bool(cfg.common.cpu))
    with open_dict(cfg):
        cfg.distributed_training.distributed_init_method = f"tcp://127.0.0.1:{_free_port()}"
    share = max(1, (threads or torch.get_num_threads()) // processes)
    try:
        torch.multiprocessing.spawn(_rank_main, args=(cfg, context, share), nprocs=processes, join=True)
    except torch.multiprocessing.ProcessRaisedException as error:
        raise StudyError(f"fairseq-train failed on one of {processes} processes: {_raised(str(error))}") from error
    except torch.multiprocessing.ProcessExitedException as error:
        raise StudyError(f"fairseq-train: one of {processes} processes ended without finishing ({error})") from error
