"""A speed-up's 95% interval from a benchmark's timing rounds: Student's t on the log ratios of paired rounds (the
machine's drift between rounds cancels), else Welch's t on the log times of each system's rounds."""

import math
from typing import Dict, List

from fairseq_headprune.study.statistics.intervals import Estimate, t_interval, welch_interval


def speedup_interval(measurement: Dict) -> Estimate:
    """The shrunk model's speed-up over the unpruned one with a t interval: on the log ratios of the rounds where
    the benchmark paired them (each round's two passes, so the machine's drift between rounds cancels; the
    estimate is their geometric mean), else on the log times of the timed rounds (Welch; none under two rounds
    of each)."""
    paired = (measurement.get("paired_ratios") or {}).get("speedup_shrunk_vs_unpruned") or []
    if len(paired) >= 2:
        logs = t_interval([math.log(r) for r in paired])
        return Estimate(math.exp(logs.value), math.exp(logs.low), math.exp(logs.high),
                        f"t on the log ratios of {len(paired)} paired rounds")
    value = measurement["speedup_shrunk_vs_unpruned"]
    unpruned, shrunk = _log_round_times(measurement, "unpruned"), _log_round_times(measurement, "shrunk")
    if min(len(unpruned), len(shrunk)) < 2:
        return Estimate(value, method="one timing round")
    logs = welch_interval(unpruned, shrunk)
    return Estimate(value, math.exp(logs.low), math.exp(logs.high), f"t on log times, {len(shrunk)} rounds")


def _log_round_times(measurement: Dict, system: str) -> List[float]:
    """The log time of each timed round of ``system``: from its seconds (translation benchmarks) or from its rate
    (the classifier benchmark records examples per second); both systems time the same examples, so the difference
    of the logs is the same either way."""
    seconds = (measurement.get("seconds") or {}).get(system)
    if seconds:
        return [math.log(s) for s in seconds]
    return [-math.log(rate) for rate in (measurement.get("examples_per_second") or {}).get(system) or []]
