"""``--quantization auto``: which compute type is kept, from timings and BLEU (plain logic), and its refusals."""

import pytest

from fairseq_headprune.errors import SettingsError
from fairseq_headprune.study.compression.precision import (
    CandidateTiming,
    auto_candidates,
    choice_summary,
    choose_compute_type,
    only_float32_choice,
)
from fairseq_headprune.study.compression.settings import CompressSettings
from fairseq_headprune.study.compression.target import CompressTarget
from fairseq_headprune.study.settings import SweepSettings


def timing(compute_type, seconds_b1, seconds_b64, bleu):
    return CandidateTiming(compute_type, {1: seconds_b1, 64: seconds_b64}, {1: 10 / seconds_b1, 64: 10 / seconds_b64},
                           bleu)


def test_the_fastest_type_within_the_tolerance_is_chosen_over_all_batch_sizes():
    candidates = [timing("float32", 2.0, 1.0, 30.0), timing("int8", 1.0, 0.5, 29.5),
                  timing("int8_float32", 1.6, 0.8, 29.8)]
    choice = choose_compute_type(candidates, 0.3)
    # int8 is faster but 0.5 BLEU below float32; int8_float32 is 0.2 below
    assert choice.chosen == "int8_float32" and choice.too_inaccurate == ["int8"]
    assert choice.speedup_vs_float32 == {1: pytest.approx(2.0 / 1.6), 64: pytest.approx(1.0 / 0.8)}
    assert choose_compute_type(candidates, 0.5).chosen == "int8"
    # faster at batch 1 but slower over both batch sizes: not chosen
    mixed = [timing("float32", 2.0, 1.0, 30.0), timing("int8", 1.9, 3.0, 30.0)]
    assert choose_compute_type(mixed, 0.3).chosen == "float32"
    assert choice_summary(choice) == (
        "int8_float32: 1.25x, 1.25x float32's speed at batch 1, 64, BLEU -0.20; timed at batch 1, 64: "
        "float32 5.0, 10.0 sent/s, BLEU 30.00; int8 10.0, 20.0 sent/s, BLEU 29.50; "
        "int8_float32 6.2, 12.5 sent/s, BLEU 29.80")
    assert choice_summary(choose_compute_type(mixed, 0.3)).startswith(
        "float32: no other type is faster within 0.3 BLEU of it; timed at batch 1, 64: float32 5.0, 10.0 sent/s")


def test_float32_is_kept_when_nothing_else_is_accurate_or_faster():
    slow = [timing("float32", 1.0, 1.0, 30.0), timing("int8", 2.0, 2.0, 30.0)]
    assert choose_compute_type(slow, 0.3).chosen == "float32"
    worse = [timing("float32", 1.0, 1.0, 30.0), timing("int8", 0.5, 0.5, 20.0)]
    assert choose_compute_type(worse, 0.3).chosen == "float32"


def test_bad_choices_are_refused():
    with pytest.raises(SettingsError, match="must be 0 or more BLEU points, got -1"):
        choose_compute_type([timing("float32", 1, 1, 1)], -1)
    with pytest.raises(SettingsError, match="compares every type with float32, which was not timed"):
        choose_compute_type([timing("int8", 1, 1, 1)], 0.3)


def test_the_candidates_are_what_ctranslate2_computes_on_the_device():
    assert auto_candidates({"float32", "int8", "int8_float32", "int16"}, "cpu") == ["float32", "int8", "int8_float32"]
    assert auto_candidates({"float32"}, "cpu") == ["float32"]
    assert auto_candidates({"float32", "float16", "int8_float16", "int8"}, "cuda") == [
        "float32", "float16", "int8_float16"]
    note = only_float32_choice({"float32"}, "cpu")
    assert note.chosen == "float32" and note.candidates == []
    assert choice_summary(note) == ("CTranslate2 computes only float32 of float32, int8, int8_float32 on cpu "
                                    "(float32): float32 is used, nothing was timed")


def test_only_float32_on_the_device_is_said_and_used_without_timing(monkeypatch, tmp_path):
    """Where CTranslate2 computes float32 alone, auto exports float32 and says so; nothing is exported or timed."""
    from fairseq_headprune.engine.export.ctranslate2.engine import CTranslate2Engine
    from fairseq_headprune.engine.pipelines import compress

    monkeypatch.setattr(CTranslate2Engine, "compute_types", lambda self, device: ["float32"])
    settings = CompressSettings(SweepSettings(str(tmp_path), "c.pt", str(tmp_path / "out"), cpu=True),
                                CompressTarget("heads", 50.0), export_format="ctranslate2", quantization="auto")
    chosen, record = compress._choose_quantization(settings, str(tmp_path / "c.pt"), str(tmp_path / "work"))
    assert chosen == "float32" and "float32 is used, nothing was timed" in record.note
    assert list(tmp_path.iterdir()) == []


def test_auto_is_refused_where_the_export_is_not_timed(tmp_path):
    evaluation = SweepSettings("d", "c", "o", family="language_model")
    with pytest.raises(SettingsError, match="a language model's export is not timed: name a type"):
        CompressSettings(evaluation, CompressTarget("heads", 50.0), export_format="ctranslate2", quantization="auto")
    with pytest.raises(SettingsError, match="the quantization tolerance must be 0 or more"):
        CompressSettings(SweepSettings("d", "c", "o"), CompressTarget("heads", 50.0), export_format="ctranslate2",
                         quantization="auto", quantization_tolerance=-0.1)
