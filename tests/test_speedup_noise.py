"""The room ``compress --target speedup`` leaves for timing noise: a speed-up's interval over the timing rounds
(the sign test's interval for a median, checked against scipy's binomial distribution), written by the engine's
own speed rows from each round's passes, and the accept rule reading its low end."""

from types import SimpleNamespace

import pytest
from scipy import stats

from fairseq_headprune.constants import CTRANSLATE2_ENGINE as CTRANSLATE2
from fairseq_headprune.engine.compression.deployment import COMPRESSED, UNPRUNED, speed_rows
from fairseq_headprune.study.compression.speed import (
    compressed_speedup_lows,
    compressed_speedups,
    median_interval_coverage,
    median_interval_rank,
    paired_speedup_interval,
)
from fairseq_headprune.study.compression.speedup.rules import ACCEPT, PRUNE_MORE, AttemptResult
from fairseq_headprune.study.compression.speedup.search import SpeedupSearch
from fairseq_headprune.study.compression.speedup.shapes import Candidate, PlannedCandidate
from fairseq_headprune.study.finetune.settings import REACHED


@pytest.mark.parametrize("rounds", range(1, 21))
def test_the_interval_rank_is_the_largest_whose_sign_test_coverage_reaches_the_confidence(rounds):
    def coverage(k):  # [k-th smallest, k-th largest] misses the median when fewer than k values lie on one side
        return 1.0 - 2.0 * stats.binom.cdf(k - 1, rounds, 0.5)

    rank = median_interval_rank(rounds, 0.9)
    fitting = [k for k in range(1, rounds // 2 + 1) if coverage(k) >= 0.9]
    assert rank == max(fitting, default=1)
    assert median_interval_coverage(rounds, 0.9) == pytest.approx(coverage(rank))


def test_the_interval_holds_the_ranked_round_ratios():
    reference = [4.0, 4.4, 3.6, 4.0, 4.2, 4.0, 3.8, 4.1, 4.0, 4.3]
    ratios = [2.6, 1.7, 2.05, 2.3, 1.8, 2.2, 1.9, 2.1, 2.0, 2.4]
    seconds = [whole / ratio for whole, ratio in zip(reference, ratios)]
    assert paired_speedup_interval(reference[:5], seconds[:5]) == pytest.approx([1.7, 2.6])  # 5 rounds: 94%
    assert paired_speedup_interval(reference, seconds) == pytest.approx([1.8, 2.4])  # 10: the 2nd from each end


def timed_rows(ratios):
    """The speed rows the engine writes for an unpruned and a compressed CTranslate2 model, both with the map,
    whose passes in each round are ``ratios`` apart (batch 1 and 64 alike)."""
    systems = [SimpleNamespace(name=f"ct2 {weights} float32 vmap", engine=CTRANSLATE2, weights=weights,
                               precision="float32", use_vmap=True) for weights in (UNPRUNED, COMPRESSED)]
    unpruned = [3.0 + 0.1 * i for i in range(len(ratios))]  # the machine drifting round by round
    seconds = {systems[0].name: unpruned, systems[1].name: [whole / r for whole, r in zip(unpruned, ratios)]}
    outputs = {system.name: ["a b c"] * 4 for system in systems}
    return [row for batch in (1, 64) for row in speed_rows(systems, seconds, outputs, batch)]


# one shape chosen (index 0) and a faster one to prune more to, both timed fast enough by the plan
PLAN = [PlannedCandidate(Candidate((("decoder", 1),), 0.5), 0.4, {1: 2.3, 64: 2.2}, 1.0),
        PlannedCandidate(Candidate((("decoder", 2),), 0.5), 0.3, {1: 3.2, 64: 3.0}, 2.0)]


def decision(rows):
    search = SpeedupSearch(PLAN, 0, 2.0, 1.0, 3, True)
    search.first()
    result = AttemptResult(-0.2, compressed_speedups(rows), REACHED, speedup_lows=compressed_speedup_lows(rows))
    return search.decide(result).decision, result


def test_a_speedup_just_above_the_target_with_rounds_spread_below_it_is_not_accepted():
    wide, result = decision(timed_rows([2.6, 1.7, 2.05, 2.3, 1.8]))
    assert result.speedups == pytest.approx({1: 2.05, 64: 2.05})  # the median, above the target
    assert result.speedup_lows == pytest.approx({1: 1.7, 64: 1.7})
    assert wide == PRUNE_MORE
    tight, result = decision(timed_rows([2.08, 2.03, 2.05, 2.1, 2.04]))
    assert result.speedups == pytest.approx({1: 2.05, 64: 2.05}) and tight == ACCEPT
