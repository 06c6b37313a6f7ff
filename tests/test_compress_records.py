"""``compress``'s typed records: one vocabulary of names, written and read by one to_dict/from_dict, and a report of
the older format read into it."""

import pytest

from fairseq_headprune.errors import ResultFileError
from fairseq_headprune.study.compression.records import (
    REPORT_FORMAT,
    CompressReport,
    ShrinkRecord,
    speedup_prediction,
)


def row(system, engine, weights, seconds, **extra):
    return {"batch_size": 1, "system": system, "engine": engine, "weights": weights, "seconds": [seconds],
            "speedup_vs_fairseq_unpruned": 8.0 / seconds, **extra}


def report_of_format_1():
    """What a run of report format 1 wrote: the shrink stage's old names, the old speed-up columns."""
    speed_rows = [
        row("fairseq unpruned", "fairseq", "unpruned", 8.0),
        row("ct2 unpruned float32", "ctranslate2", "unpruned", 1.0),
        row("ct2 compressed float32", "ctranslate2", "compressed", 0.5,
            speedup_vs_ct2_unpruned_same_precision=2.0, speedup_vs_ct2_unpruned_vmap=None),
        row("ct2 unpruned float32 vmap", "ctranslate2", "unpruned", 0.8),
        row("ct2 compressed float32 vmap", "ctranslate2", "compressed", 0.2,
            speedup_vs_ct2_unpruned_same_precision=5.0, speedup_vs_ct2_unpruned_vmap=4.0),
    ]
    return {
        "format": "fairseq-headprune compress report 1", "checkpoint": "/c.pt", "data": "/d", "family": "translation",
        "target": "flops=50%", "layers": None, "distill": None,
        "fisher": {"file": "importance.json", "subsets": ["valid"], "sentences": 64, "neurons": True,
                   "stage": "fisher", "seconds": 1.0},
        "search": {"target": "flops=50%", "heads_pruned": 3, "heads_total": 48, "spec": "E:1:1-3",
                   "neurons_pruned": 0, "neurons_total": 512, "ffn_spec": None,
                   "flops": {"kept": 1.0, "full": 2.0, "unit": "FLOPs/token", "sequence_length": 16},
                   "predicted_speedup": 1.8, "latency_table_shape": {"batch_size": 1, "beam": 5},
                   "stage": "search", "seconds": 2.0},
        "finetune": None,
        "shrink": {"checkpoint": "checkpoint.pt", "heads_removed": 3, "heads_total": 48, "spec": "E:1:1-3",
                   "neurons_removed": 0, "neurons_total": 512, "neuron_spec": None,
                   "parameters": {"unpruned": 100, "compressed": 90}, "report": [], "stage": "shrink",
                   "seconds": 0.1},
        "export": None,
        "evaluation": {"label": "BLEU", "unpruned": 50.0, "compressed": 49.0, "delta": -1.0, "p_value": 0.2,
                       "bleu_sacrebleu": {"unpruned": 48.0}, "stage": "evaluate", "seconds": 3.0},
        "speed": {"split": "test", "rows": speed_rows, "stage": "speed", "seconds": 4.0},
        "speedup_prediction": None, "files": {"checkpoint": "/out/shrink/checkpoint.pt", "exported": None},
        "stages": {"fisher": {"status": "ran", "seconds": 1.0}},
    }


def test_a_report_of_format_1_is_read_with_format_2s_names():
    report = CompressReport.from_dict(report_of_format_1())
    shrink = report.shrink
    assert (shrink.heads_pruned, shrink.neurons_pruned, shrink.ffn_spec) == (3, 0, None)
    assert report.format == REPORT_FORMAT and not shrink.extra
    written = report.to_dict()
    assert "heads_removed" not in written["shrink"] and written["shrink"]["heads_pruned"] == 3
    # a family's extra scores are kept under their own keys, the stage's time after them
    assert written["evaluation"]["bleu_sacrebleu"] == {"unpruned": 48.0}
    assert list(written["evaluation"])[-2:] == ["stage", "seconds"]
    rows = {r.system: r for r in report.speed.rows}
    # the mapped compressed model like for like is against the mapped unpruned one; the stock conversion apart
    assert rows["ct2 compressed float32 vmap"].speedup_like_for_like == 4.0
    assert rows["ct2 compressed float32 vmap"].speedup_vs_stock_conversion == 5.0
    assert rows["ct2 compressed float32"].speedup_like_for_like == 2.0
    assert rows["ct2 unpruned float32"].speedup_like_for_like is None
    # rows written before vocabulary_mapped was a field say it by their name
    assert [r.system for r in report.speed.rows if r.vocabulary_mapped] == ["ct2 unpruned float32 vmap",
                                                                              "ct2 compressed float32 vmap"]
    assert report.flops_kept_share == pytest.approx(0.5)
    # the latency table's prediction is set beside the unmapped compressed model's like-for-like speed-up
    prediction = speedup_prediction(report.search, report.speed)
    assert (prediction.predicted, prediction.measured) == (1.8, 2.0)
    assert prediction.relative_error == pytest.approx(-0.1)


def test_records_round_trip_and_unknown_formats_are_refused():
    report = CompressReport.from_dict(report_of_format_1())
    again = CompressReport.from_dict(report.to_dict())
    assert again.to_dict() == report.to_dict()
    record = ShrinkRecord.from_dict(report.to_dict()["shrink"])
    assert isinstance(record, ShrinkRecord) and record.to_dict() == report.to_dict()["shrink"]
    with pytest.raises(ValueError, match="not a compress report of a known format"):
        CompressReport.from_dict(dict(report_of_format_1(), format="something else"))
    # a record that lacks a fact its type requires, or is not an object, is refused by name
    broken = report.to_dict()
    del broken["fisher"]
    with pytest.raises(ResultFileError, match="a CompressReport record lacks fisher"):
        CompressReport.from_dict(broken)
    broken = report.to_dict()
    del broken["search"]["flops"]["sequence_length"]
    with pytest.raises(ResultFileError, match="a FlopsKept record lacks sequence_length"):
        CompressReport.from_dict(broken)
    with pytest.raises(ResultFileError, match="a ShrinkRecord record is a JSON object, not list"):
        ShrinkRecord.from_dict([])


def test_speed_rows_beams_and_predictions_round_trip():
    from fairseq_headprune.study.compression.records import BeamResult, Prediction
    from fairseq_headprune.study.compression.speed import SpeedRow, compressed_speedups, paired_speedup

    at_run_beam = SpeedRow(batch_size=64, system="ct2 compressed float32 vmap", engine="ctranslate2",
                           weights="compressed", precision="float32", seconds=[1.0, 2.0, 1.5], sentences=8,
                           speedup_like_for_like=2.5, vocabulary_mapped=True)
    at_beam_1 = SpeedRow(batch_size=1, system="ct2 compressed float32 vmap", engine="ctranslate2",
                         weights="compressed", precision="float32", seconds=[0.5], vocabulary_mapped=True, beam=1,
                         run_beam_seconds=[2.0], speedup_vs_run_beam=4.0)
    for row in (at_run_beam, at_beam_1):
        assert SpeedRow.from_dict(row.to_dict()) == row
    assert "beam" not in at_run_beam.to_dict() and at_beam_1.to_dict()["beam"] == 1
    assert compressed_speedups([at_run_beam]) == {64: 2.5} and compressed_speedups([at_run_beam]).to_dict() == {
        "64": 2.5}
    assert compressed_speedups([at_beam_1], against_run_beam=True) == {1: 4.0}
    assert compressed_speedups([at_run_beam], vocabulary_mapped=False) == {}
    beam = BeamResult(1, 50.0, 49.0, -1.0, 0.2, -0.5, 0.4)
    assert BeamResult.from_dict(beam.to_dict()) == beam
    prediction = Prediction(2.2, 2.0, 64, 5)
    assert Prediction.from_dict(prediction.to_dict()) == prediction
    # the speed-up report's older name for the prediction
    assert Prediction.from_dict({"planned": 2.2, "measured": 2.0}).predicted == 2.2
    # the one estimator: the median over rounds of the paired ratio, not a ratio of medians
    assert paired_speedup([2.0, 4.0, 3.0], [1.0, 1.0, 3.0]) == 2.0
    with pytest.raises(ValueError, match="one pass of each system per round"):
        paired_speedup([1.0, 2.0], [1.0])


def speedup_report():
    from fairseq_headprune.study.compression.records import Prediction, ScoreChange
    from fairseq_headprune.study.compression.speedup.records import (
        AttemptRecord,
        FinetuneSummary,
        PlanRecord,
        SpeedupReport,
        SpeedupResult,
    )
    from fairseq_headprune.study.compression.speedup.shapes import Candidate, PlannedCandidate, out_of_order
    from fairseq_headprune.study.finetune.settings import Validation
    from fairseq_headprune.study.masks.layer_drop import LayerChoice, LayerStep

    candidates = [PlannedCandidate(Candidate((("decoder", 1), ("encoder", 0)), 1.0), 0.7, {"1": 1.6, "64": 1.5}, 0.4),
                  PlannedCandidate(Candidate((("decoder", 1), ("encoder", 0)), 0.5), 0.4, {"1": 2.3, "64": 2.1}, 0.9),
                  PlannedCandidate(Candidate((("decoder", 2), ("encoder", 0)), 0.5), 0.2, {"1": 1.5, "64": 2.9}, 3.1)]
    choice = LayerChoice({"decoder": [2]}, 2.1, [LayerStep("decoder", 3, 2.5)])
    plan = PlanRecord(factor=2.0, margin=0.1, batch_sizes=[1, 64], split="valid", sentences=64, beam=5,
                      target_length=20, repeats=5, candidates=candidates, chosen=1, map_gain={"1": 1.2, "64": 1.1},
                      out_of_order=out_of_order(candidates), decision_subset="valid", reference=41.0,
                      generation={"beam": 5, "lenpen": 1.0}, remove_bpe="subword_nmt", base_loss=2.1,
                      damage_sentences=500, layer_choices={"1 decoder layer": choice}, stage="plan", seconds=12.0)
    decided = ScoreChange("valid", "BLEU", 41.0, 40.6, -0.4, 0.2, 1000, 3.0)
    attempt = AttemptRecord(attempt=1, dir="attempt-1", shape=candidates[1], continued_from=None,
                            finetune=FinetuneSummary(400, "reached", 400,
                                                     [Validation(200, 38.0), Validation(400, 40.7)], 57.1, "cuda",
                                                     "bfloat16"),
                            score=decided, speedups={"1": 2.2, "64": 2.05}, decision="accept")
    result = SpeedupResult(attempt=1, decided=decided, reported=ScoreChange("test", "BLEU", 40.0, 39.5, -0.5, 0.25,
                                                                            1000, 2.5),
                           speedups={"1": 2.25, "64": 2.0}, prediction={"1": Prediction(2.3, 2.25)},
                           report="result/report.md", checkpoint="/o/result/shrink/checkpoint.pt",
                           exported="/o/result/export/compressed")
    return SpeedupReport(checkpoint="/c.pt", target="speedup=2x", factor=2.0, max_bleu_loss=1.0, plan=plan,
                         attempts=[attempt], result=result)


def test_a_speedup_report_round_trips_and_derives_what_it_does_not_store():
    from fairseq_headprune.study.compression.speedup.records import SpeedupReport

    report = speedup_report()
    written = report.to_dict()
    again = SpeedupReport.from_dict(written)
    assert again == report and again.to_dict() == written
    assert report.plan.out_of_order
    assert written["plan"]["out_of_order"][0]["smaller"] == report.plan.out_of_order[0].smaller
    assert again.plan.layer_choices["1 decoder layer"].dropped == {"decoder": [2]}
    # one test of fast enough and within the tolerance, derived, not stored twice; on both splits
    result = written["result"]
    assert (result["reached_target"], result["within_tolerance"], result["within_tolerance_reported"]) == (
        True, True, True)
    assert "loss" not in written["attempts"][0] and "fast_enough" not in written["attempts"][0]
    assert written["plan"]["chosen_name"] == "1 decoder layer removed, 50% width"
    assert written["plan"]["breakdown"]["layers removed"] == {"1": 1.6, "64": 1.5}
    # the fine-tune's time, device and precision, stated in the attempts table
    from fairseq_headprune.study.compression.speedup.report import speedup_report_markdown

    assert "400 updates in 1.0 min on the GPU in bfloat16, stopped: reached" in speedup_report_markdown(report)


def test_a_speedup_report_of_format_1_is_read_as_decided_and_reported_on_its_test_split():
    from fairseq_headprune.study.compression.speedup.records import SpeedupReport

    written = speedup_report().to_dict()
    plan = {key: value for key, value in written["plan"].items()
            if key in ("factor", "batch_sizes", "quantization", "split", "sentences", "beam", "target_length",
                       "repeats", "candidates", "chosen", "map_gain", "out_of_order", "environment", "stage",
                       "seconds")}
    old = {"format": "fairseq-headprune compress speedup 1", "checkpoint": "/c.pt", "target": "speedup=2x",
           "factor": 2.0, "max_bleu_loss": 1.0, "plan": plan,
           "attempts": [{"attempt": 1, "dir": "attempt-1", "shape": written["attempts"][0]["shape"],
                         "continued_from": None, "finetune_updates": 800, "metric": "BLEU", "unpruned": 40.0,
                         "samples": 1000, "compressed": 39.5, "delta": -0.5, "p_value": 0.25, "loss": 0.5,
                         "speedups": {"1": 2.2, "64": 2.05}, "fast_enough": True, "decision": "accept"}],
           "result": {"attempt": 1, "within_tolerance": True, "reached_target": True,
                      "speedups": {"1": 2.2, "64": 2.05}, "delta": -0.5, "p_value": 0.25, "samples": 1000,
                      "prediction": {"1": {"planned": 2.3, "measured": 2.2, "relative_error": 0.045}},
                      "report": "attempt-1/report.md", "checkpoint": "/c", "exported": "/e"}}
    report = SpeedupReport.from_dict(old)
    attempt = report.attempts[0]
    assert (attempt.score.split, attempt.score.delta, attempt.finetune.updates) == ("test", -0.5, 800)
    assert report.result.decided == report.result.reported and report.result.reported.split == "test"
    assert report.result.prediction[1].predicted == 2.3 and report.within_tolerance and report.reached_target
    assert report.plan.reference is None and report.plan.layer_choices == {}  # format 1 measured neither
    with pytest.raises(ValueError, match="not a speed-up report"):
        SpeedupReport.from_dict(dict(written, format="fairseq-headprune compress report 2"))


def test_a_speedup_report_counts_each_stage_once_in_its_minutes():
    from dataclasses import replace

    from fairseq_headprune.study.compression.speedup.report import speedup_report_markdown

    report = speedup_report()
    first = replace(report.attempts[0], seconds={"distill": 60.0, "finetune": 600.0, "speed": 120.0})
    # a second attempt took the first one's distilled data (the same record): its minute counts in the first
    second = replace(first, attempt=2, dir="attempt-2", seconds={"distill": 60.0, "finetune": 300.0, "speed": 60.0})
    report = replace(report, attempts=[first, second], result=replace(report.result, seconds={"evaluate": 90.0}))
    report.plan.seconds = 30.0
    minutes = report.minutes
    assert minutes["attempt 1"] == pytest.approx(13.0) and minutes["attempt 2"] == pytest.approx(6.0)
    assert minutes["attempt 1 fine-tuning"] == pytest.approx(10.0) and minutes["result"] == pytest.approx(1.5)
    assert minutes["in all"] == pytest.approx(0.5 + 13.0 + 6.0 + 1.5)
    assert "| attempt 2 | 6.0 | 5.0 |" in speedup_report_markdown(report)
    # the second attempt's fine-tune resumed after a kill: its stage ran 300 s in the last process, fairseq's
    # training clock counts 900 s over all of them; the table says what the attempts table says
    resumed = replace(second, finetune=replace(second.finetune, seconds=900.0))
    report = replace(report, attempts=[first, resumed])
    minutes = report.minutes
    assert minutes["attempt 2 fine-tuning"] == pytest.approx(15.0) and minutes["attempt 2"] == pytest.approx(16.0)
    assert minutes["attempt 1 fine-tuning"] == pytest.approx(10.0)  # its clock (if any) is below its stage's
    assert "| attempt 2 | 16.0 | 15.0 |" in speedup_report_markdown(report)
