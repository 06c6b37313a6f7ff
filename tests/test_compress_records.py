"""``compress``'s typed records: one vocabulary of names, written and read by one to_dict/from_dict, and a report of
the older format read into it."""

import pytest

from fairseq_headprune.study.compression.records import (
    REPORT_FORMAT,
    CompressReport,
    ShrinkRecord,
    speedup_prediction,
    stage_record,
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
                   "neurons_pruned": 0, "neurons_total": 512, "ffn_spec": None, "flops": {"kept": 1.0, "full": 2.0},
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
    rows = {r["system"]: r for r in report.speed.rows}
    # the mapped compressed model like for like is against the mapped unpruned one; the stock conversion apart
    assert rows["ct2 compressed float32 vmap"]["speedup_like_for_like"] == 4.0
    assert rows["ct2 compressed float32 vmap"]["speedup_vs_stock_conversion"] == 5.0
    assert rows["ct2 compressed float32"]["speedup_like_for_like"] == 2.0
    assert rows["ct2 unpruned float32"]["speedup_like_for_like"] is None
    assert report.flops_kept_share == pytest.approx(0.5)
    # the latency table's prediction is set beside the unmapped compressed model's like-for-like speed-up
    assert speedup_prediction(report.search, report.speed)["measured"] == 2.0


def test_records_round_trip_and_unknown_formats_are_refused():
    report = CompressReport.from_dict(report_of_format_1())
    again = CompressReport.from_dict(report.to_dict())
    assert again.to_dict() == report.to_dict()
    record = stage_record("shrink", report.to_dict()["shrink"])
    assert isinstance(record, ShrinkRecord) and record.to_dict() == report.to_dict()["shrink"]
    with pytest.raises(ValueError, match="not a compress report of a known format"):
        CompressReport.from_dict(dict(report_of_format_1(), format="something else"))
