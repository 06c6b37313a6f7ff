"""The plan's damage: paired with the unpruned model batch for batch, its standard error, and the random sample
of a large Fisher split (``study.compression.speedup.damage``)."""

import numpy as np
import pytest
from scipy import stats

from fairseq_headprune.study.compression.speedup import damage as damage_module
from fairseq_headprune.study.compression.speedup.damage import DAMAGE_SAMPLE, damage_sample, paired_damage


def _batches(seed=0, count=40):
    """Batches of a shape and of the unpruned model: summed losses over their target tokens."""
    generator = np.random.default_rng(seed)
    tokens = generator.integers(200, 900, count).astype(float)
    unpruned = tokens * generator.normal(3.0, 0.2, count)
    shape = unpruned + tokens * generator.normal(0.4, 0.15, count)
    return list(zip(shape, tokens)), list(zip(unpruned, tokens))


def test_the_damage_is_the_mean_loss_difference_and_its_error_the_bootstrap_spread_over_batches():
    shape, unpruned = _batches()
    damage, error = paired_damage(shape, unpruned)
    tokens = sum(n for _, n in unpruned)
    assert damage == pytest.approx(sum(v for v, _ in shape) / tokens - sum(v for v, _ in unpruned) / tokens)
    # scipy's bootstrap of the same ratio, resampling whole batches
    differences = np.array([s - u for (s, _), (u, _) in zip(shape, unpruned)])
    counts = np.array([n for _, n in unpruned])
    spread = stats.bootstrap((differences, counts), lambda d, n: d.sum() / n.sum(), paired=True,
                             n_resamples=4000, random_state=1, vectorized=False).standard_error
    assert error == pytest.approx(spread, rel=0.1)
    # one batch: no spread to estimate
    assert paired_damage(shape[:1], unpruned[:1])[1] is None
    with pytest.raises(ValueError):
        paired_damage(shape[:3], unpruned[:2])


def test_a_large_split_is_sampled_at_random_once_and_a_small_one_whole():
    assert damage_sample(DAMAGE_SAMPLE) is None
    drawn = damage_sample(5 * DAMAGE_SAMPLE)
    assert len(drawn) == len(set(drawn)) == DAMAGE_SAMPLE and drawn == sorted(drawn)
    assert drawn == damage_sample(5 * DAMAGE_SAMPLE) and max(drawn) >= 4 * DAMAGE_SAMPLE  # not the first ones


def test_the_plan_measures_the_damage_on_the_sentences_of_its_sample(tiny_task_and_model, monkeypatch):
    """The Fisher split collated for the damage holds the sample's sentences and no other (a sample of 20 here,
    the tiny valid split being smaller than the real sample)."""
    from fairseq_headprune.engine.runners.batches import collated_samples

    task, model = tiny_task_and_model
    monkeypatch.setattr(damage_module, "DAMAGE_SAMPLE", 20)
    task.load_dataset("valid")
    picked = damage_sample(len(task.dataset("valid")))
    samples = collated_samples(task, model, ["valid"], None, 64, None, sample=damage_sample)
    ids = sorted(int(i) for sample in samples for i in sample["id"])
    assert picked is not None and ids == picked
