"""``compress``'s stage directories: each built in ``NAME.partial`` and renamed when complete, its record in
``NAME/stage.json``, skipped when present, so that an interrupted run resumes where it stopped; and the run's
directory, which holds one run's settings (``compress.json``) and refuses another's."""

import json
import os
import shutil
import time
from typing import Callable, Dict, Optional, Sequence, Type, TypeVar

from fairseq_headprune.errors import SettingsError, StudyError
from fairseq_headprune.study.compression.records import StageRecord
from fairseq_headprune.study.output.files import first_difference, recorded_identity, write_json
from fairseq_headprune.study.settings import options_as_settings

RECORD = "compress.json"
STAGE_RECORD = "stage.json"
PARTIAL = ".partial"
CLOCK = "clock.json"  # in a resumable stage's partial directory: its earlier processes' seconds, when this one began
# on_stage(stage, status, seconds): status "running", "ran" or "kept"
StageCallback = Callable[[str, str, Optional[float]], None]
Record = TypeVar("Record", bound=StageRecord)


class Stages:
    """The stage directories of one run: built in NAME.partial, renamed whole, skipped when present."""

    def __init__(self, out_dir: str, on_stage: Optional[StageCallback]):
        self.out_dir, self.on_stage, self.status = out_dir, on_stage, {}

    def path(self, stage: str, *parts: str) -> str:
        return os.path.join(self.out_dir, stage, *parts)

    def record(self, stage: str, record_type: Type[Record]) -> Optional[Record]:
        """The stage's record read back as ``record_type``, or None while the stage is not complete."""
        path = self.path(stage, STAGE_RECORD)
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as stream:
            return record_type.from_dict(json.load(stream))

    def run(self, stage: str, build: Callable[[str], StageRecord], resumable: bool = False,
            feeds_later: bool = True) -> None:
        """``build(work_dir)`` returns the stage's record; ``resumable``: a partial directory is kept (sweeps,
        fine-tuning).

        Once a stage has run, the stages after it run again too: what they hold was made from what it replaced;
        ``feeds_later=False``: a measurement no later stage is made from (the speed-up run's cost), which redoes
        none of them.
        """
        redone = "ran" in self.status.values()
        if os.path.isfile(self.path(stage, STAGE_RECORD)) and not redone:
            self.status[stage] = "kept"
            self._tell(stage, "kept", None)
            return
        work = self.path(stage) + PARTIAL
        if os.path.isdir(work) and (redone or not resumable):
            shutil.rmtree(work)
        os.makedirs(work, exist_ok=True)
        earlier = _earlier_processes_seconds(work) if resumable else 0.0
        self._tell(stage, "running", None)
        start = time.perf_counter()
        record = build(work)
        record.stage, record.seconds = stage, earlier + time.perf_counter() - start
        seconds = record.seconds
        if resumable:
            os.remove(os.path.join(work, CLOCK))
        write_json(record.to_dict(), os.path.join(work, STAGE_RECORD), indent=1)
        if os.path.isdir(self.path(stage)):
            shutil.rmtree(self.path(stage))  # made from an earlier stage's outputs that were just replaced
        os.replace(work, self.path(stage))
        self.status[stage] = "ran" if feeds_later else "measured"
        self._tell(stage, "ran", seconds)

    def _tell(self, stage, status, seconds) -> None:
        if self.on_stage is not None:
            self.on_stage(stage, status, seconds)


def _earlier_processes_seconds(work: str) -> float:
    """The seconds earlier processes spent on a resumable stage, each from its start to its last write into the
    partial directory (what it did after that was lost with it and is done again), measured when the next one
    starts (before it overwrites anything); and this process's start, added to the directory's clock."""
    clock_path = os.path.join(work, CLOCK)
    spans, started = [], None
    if os.path.isfile(clock_path):
        with open(clock_path, encoding="utf-8") as stream:
            clock = json.load(stream)
        spans, started = clock["spans"], clock["started"]
        last_write = max((os.path.getmtime(os.path.join(folder, name)) for folder, _, names in os.walk(work)
                          for name in names if name != CLOCK), default=started)
        spans.append(max(last_write - started, 0.0))
    write_json({"spans": spans, "started": time.time()}, clock_path, indent=1)
    return sum(spans)


def open_out_dir(out_dir: str, identity: Dict[str, object], stages: Sequence[str]) -> None:
    """Create the run's directory, or check that it holds this very run: one of other settings is refused once
    any of ``stages`` (those a run of its kind writes) is complete there."""
    record = os.path.join(out_dir, RECORD)
    if os.path.isfile(record):
        recorded = recorded_identity(record, "a compress record", "output directory")
        if isinstance(recorded.get("fairseq_args"), list):  # recorded as given, in order, before they were settings
            recorded["fairseq_args"] = options_as_settings(recorded["fairseq_args"])
        difference = first_difference(recorded, identity)
        finished = [stage for stage in stages if os.path.isfile(os.path.join(out_dir, stage, STAGE_RECORD))]
        if difference is not None and finished:
            raise StudyError(f"the output directory {out_dir} holds a compress run of other settings ({difference}); "
                             "use another", setting="out_dir")
        if difference is not None:  # a run that stopped before any stage finished: this one starts afresh
            write_json({"identity": identity}, record, indent=1)
        return
    if os.path.isfile(out_dir) or (os.path.isdir(out_dir) and os.listdir(out_dir)):
        raise SettingsError(f"the output directory {out_dir} exists, is not empty and holds no compress run; nothing "
                            "was written", setting="out_dir")
    os.makedirs(out_dir, exist_ok=True)
    write_json({"identity": identity}, record, indent=1)
