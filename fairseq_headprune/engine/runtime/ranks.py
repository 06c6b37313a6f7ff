"""The processes of a sharded study, as an existing launcher starts them.

``torchrun --standalone --nproc-per-node N "$(command -v fairseq-headprune)" ablate …``
starts N copies of a command with ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` set. Every copy loads the model; a sweep then gives each rank
a disjoint share of the configurations (round robin over the same batches of
configurations one process would translate, so every configuration's
translation is the one a single process makes), importance estimation gives
each rank a share of the batches and sums the per-head statistics over the
ranks as fairseq's trainer sums ``logging_outputs`` over workers, and rank 0
alone writes tables, figures and the console. Without those variables there
is one rank and nothing here talks to another process.

The collectives run over gloo (CPU tensors), so the same code shards over
CPU processes or over GPUs (each rank on ``cuda:LOCAL_RANK``).
"""

import contextlib
import datetime
import os
from typing import Any, Iterator, List, Optional

import torch
import torch.distributed as dist

from fairseq_headprune.errors import StudyError

SHARDED_COMMANDS = ("ablate", "prune", "dynamics", "importance")
COLLECTIVE_TIMEOUT = datetime.timedelta(days=7)


class Ranks:
    """This process's place among the ranks of one study."""

    def __init__(self, rank: int = 0, world_size: int = 1):
        self.rank, self.world_size = rank, world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.world_size > 1

    def require_work_for_each(self, count: int, what: str) -> None:
        """Refuse a launch with more ranks than ``count`` units of work, before anything is written."""
        if self.world_size > count:
            raise StudyError(
                f"{self.world_size} ranks (torchrun --nproc-per-node) for {count} {what}: "
                f"some ranks would have nothing to do; launch at most {count}"
            )

    def share(self, items: List[Any]) -> List[Any]:
        """This rank's items: every world_size-th, starting at its rank."""
        return items[self.rank::self.world_size]

    def barrier(self) -> None:
        if self.sharded:

            dist.barrier()

    def main_value(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank, so that all ranks take the same branch."""
        if not self.sharded:
            return value

        holder = [value]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def gather(self, value: Any) -> List[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        if not self.sharded:
            return [value]

        values: List[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values


_current: Optional[Ranks] = None


@contextlib.contextmanager
def alone() -> Iterator[Ranks]:
    """Inside: this process is a study of one rank (work a rank does by itself, such as one fine-tuned
    configuration's sweep); the ranks it belongs to again after."""
    global _current
    outer = current_ranks()
    _current = Ranks()
    try:
        yield _current
    finally:
        _current = outer


def current_ranks() -> Ranks:
    """The ranks of this study (one, unless a launcher set WORLD_SIZE > 1)."""
    global _current
    if _current is None:
        _current = Ranks()
    return _current


def launched_world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def join_ranks() -> Ranks:
    """Join the process group a launcher described in the environment (once per process)."""
    global _current
    world_size = launched_world_size()
    if world_size <= 1:
        return current_ranks()
    if _current is not None and _current.sharded:
        return _current

    if not dist.is_initialized():
        # a rank done with its share waits at a barrier for the others' last configuration, which may be a
        # whole fine-tune (prune --finetune-epochs): far longer than gloo's default 30 minutes
        dist.init_process_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    _current = Ranks(dist.get_rank(), dist.get_world_size())
    return _current


def leave_ranks() -> None:
    """Leave the process group cleanly (torch warns when a process exits inside one)."""
    global _current
    if _current is not None and _current.sharded:

        if dist.is_initialized():
            dist.destroy_process_group()
    _current = None
