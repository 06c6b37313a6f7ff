"""The report's verdicts on the papers' findings follow from the numbers, by the stated rules."""

import numpy
import pytest

from fairseq_headprune.study.output.findings import markdown_findings, paper_findings


def curve(order, points, std=0.0, draws=1):
    return [{"order": order, "percent": p, "bleu": b, "bleu_std": std, "draws": draws} for p, b in points]


def study(importance_at_50=40.0, random_at_50=20.0, random_std=3.0, enc_dec_last=5.0, r=0.8):
    return {
        "ablation/single.json": {"rows": [
            {"attention_type": "enc-enc", "layer": 1, "head": h, "delta": -0.1 * h, "significant": h > 6}
            for h in range(1, 9)]},
        "ablation/cross_domain.json": {"settings": {"pearson_r": r}},
        "pruning/prune_curves.all.json": {"settings": {"baseline_bleu": 50.0}, "rows":
            curve("importance", [(0, 50.0), (20, 49.0), (50, importance_at_50)])
            + curve("ablation", [(0, 50.0), (20, 45.0), (50, 30.0)])
            + curve("random", [(0, 50.0), (20, 44.0), (50, random_at_50)], std=random_std, draws=3)},
        "pruning/prune_curves.enc-enc.json": {"rows": curve("importance", [(0, 50.0), (90, 45.0)])},
        "pruning/prune_curves.enc-dec.json": {"rows": curve("importance", [(0, 50.0), (90, enc_dec_last)])},
    }


def verdicts(payloads):
    rows = paper_findings(payloads.get)
    return {row.finding.split(" (")[0]: row.verdict for row in rows}, rows


def test_verdicts_follow_the_numbers():
    found, rows = verdicts(study())
    assert found["masking one head at a time rarely hurts significantly"] == "yes"  # 2 of 8 significant
    assert found["a head's effect correlates across domains"] == "yes"
    assert found["a share of the heads can be pruned with little loss"] == "yes"  # 49 >= 0.95 * 50
    assert found["importance is a better pruning order than single-head ablation scores"] == "yes"
    # random against importance is this project's comparison, neither paper's claim: shown, not judged
    extension = next(row for row in rows if row.finding.startswith("random against importance-ordered pruning"))
    assert extension.verdict is None and "this project's comparison" in extension.finding
    assert found["Enc-Dec attention is the most sensitive to pruning"] == "yes"
    # findings without result files are left out, not guessed
    assert not any("training" in row.finding or "budget" in row.finding for row in rows)
    table = markdown_findings(rows)
    assert table.count("\n") == len(rows) + 2 and "not judged" in table
    assert "random within about 1 BLEU" not in table  # not a claim of the paper


def test_the_other_numbers_give_the_other_verdicts():
    found, _ = verdicts(study(importance_at_50=21.0, enc_dec_last=48.0, r=0.3))
    assert found["Enc-Dec attention is the most sensitive to pruning"] == "no"
    assert found["a head's effect correlates across domains"] == "no"


def test_a_classifier_is_held_to_the_bert_findings_and_an_lm_to_none():
    """The metric recorded in the result files decides: accuracy -> BERT's statements at 40%; perplexity -> none."""
    payloads = study()
    curves = payloads["pruning/prune_curves.all.json"]
    curves["settings"] = {"metric": "accuracy", "baseline_accuracy": 50.0}
    for row in curves["rows"]:
        row["accuracy"], row["accuracy_std"] = row.pop("bleu"), row.pop("bleu_std")
    curves["rows"].append({"order": "importance", "percent": 40, "accuracy": 47.0, "accuracy_std": 0.0, "draws": 1})
    found, rows = verdicts(payloads)
    share = next(row for row in rows if row.finding.startswith("a share of the heads"))
    assert share.paper == "40% of the heads pruned by importance with no noticeable loss"
    assert share.study == "40% pruned by importance: accuracy 47.00 (94% of 50.00)" and share.verdict == "no"
    assert "most of the 144 heads" in next(row for row in rows if row.finding.startswith("masking one head")).paper
    curves["settings"] = {"metric": "ppl", "baseline_ppl": 50.0}
    assert paper_findings(payloads.get) == []


def write(path, payload):
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


def test_the_report_reads_the_speed_benchmark_and_the_comparison_of_pruning_methods(tmp_path):
    from fairseq_headprune.study.output.report import write_report
    from fairseq_headprune.study.pruning.comparison import goal_check

    measurement = {"removed_heads": 36, "total_heads": 72, "batch_size": 64, "speedup_shrunk_vs_unpruned": 1.3,
                   "median_seconds": {"unpruned": 1.0, "masked": 1.1, "shrunk": 0.77},
                   "parameters": {"unpruned": 100, "shrunk": 80},
                   "same_hypotheses": {"masked_shrunk": True, "masked_fairseq_path": True}}  # benchmark_speed.py's
    write(tmp_path / "shrink" / "speed.json", {"device": "cpu", "threads": 2, "measurements": [measurement]})
    # levels rounded up as prune's are: 11%, 50%, 71% of 72 heads
    rows = (curve("importance", [(0, 50.0), (11.1, 48.0), (50.0, 30.0), (70.8, 10.0), (90.3, 0.0)])
            + curve("fisher-rearranged+tuned", [(0, 50.0), (11.1, 49.0), (50.0, 42.0), (70.8, 9.0), (90.3, 0.0)]))
    for row in rows:
        row["scope"], row["pruned"] = "all", round(row["percent"] * 72 / 100)
    settings = {"baseline_bleu": 50.0, "split": "test", "draws": 3, "bleu": "tokenized",
                "method_costs": {"importance": {"seconds": 1.5, "sentences": 500},
                                 "fisher-rearranged+tuned": {"seconds": 9.0, "sentences": 500,
                                                             "tuning_sentences": 400}}}
    write(tmp_path / "comparison" / "prune_curves.all.json", {"settings": settings, "rows": rows})
    text = open(write_report(str(tmp_path))).read()
    assert "| 36 of 72 | 64 | 1.00 | 1.10 | 0.77 | 1.30x | yes | 100 → 80 |" in text
    # loss 8 against 20 at 50%: 0.40 of it (met); worse at 70% (9 < 10)
    assert "0.40 of its loss (goal: at most half: met)" in text and "NOT met (worse at 71%)" in text
    assert "| Fisher search + rearrangement + mask tuning | 9.0 | 500 | 400 |" in text
    goal = goal_check(rows, 50.0)
    assert goal["loss_tuned"] == 8.0 and goal["loss_reference"] == 20.0 and goal["levels_worse"] == [70.8]
    assert goal["levels_compared"] == [11.1, 50.0, 70.8]  # 0% and 90% are outside 10-70%


def record(name, label, kind, percent, after, before=10.0, budget=None, tables=(), level=None, arm="", curve=None,
           against_unpruned=None, spread=None, spreads=None, updates=500, trained=490, epochs=10):
    """One record of finetune/results.json, tested against the unpruned model scoring 50 and the control 51."""
    data = {"name": name, "label": label, "kind": kind, "percent": percent, "budget": budget or label, "spec": "x",
            "score_before": before, "score_after": after, "metric": "bleu", "finetune": f"{updates} updates",
            "updates": updates, "trained_updates": trained, "trained_epochs": epochs, "tables": list(tables),
            "paper_level": level, "arm": arm, "layer_spread": spread, "layer_spreads": spreads or {},
            "curve": curve or []}
    data.update(delta_vs_unpruned=after - 50.0, p_value_vs_unpruned=0.5, significant_vs_unpruned=False)
    if name != "control":
        data.update(delta_vs_control=after - 51.0, p_value_vs_control=0.5, significant_vs_control=False)
    return data


def points(*scores, end=500):
    """A recovery curve from 0 to ``end`` updates, evenly spaced."""
    step = end / (len(scores) - 1)
    return [{"stop": "update", "at": round(i * step), "updates": round(i * step), "score": s}
            for i, s in enumerate(scores)]


def level_records(after=(49.5, 49.6, 49.4), updates=500, curve=None, percent=61.1):
    control = record("control", "unpruned (control)", "control", 0.0, 51.0, before=50.0, updates=updates,
                     curve=points(50.0, 51.0, 51.0, 51.0, 51.0, end=updates))
    draws = [record(f"l{i}", f"60% draw {i + 1}", "level", percent, score, budget="60%", tables=(1,), level=60,
                    updates=updates, curve=curve) for i, score in enumerate(after)]
    return [control, *draws]


def judged(records, bert=False):
    from fairseq_headprune.study.budhraja.findings import budhraja_findings

    payloads = {"pruning/finetune/results.json": records}
    return {row.finding: row for row in budhraja_findings(payloads.get, bert, "accuracy" if bert else "BLEU")}


def row_starting(rows, start):
    return next(row for name, row in rows.items() if name.startswith(start))


def test_table1_is_judged_against_the_unpruned_model_and_the_control_with_its_evidence():
    rows = judged(level_records())
    unpruned = row_starting(rows, "60% of the heads pruned at random, fine-tuned, lose little against the unpruned "
                                  "model (the paper's baseline)")
    control = row_starting(rows, "60% of the heads pruned at random, fine-tuned, lose little against the unpruned "
                                 "model fine-tuned alike")
    assert unpruned.verdict == "yes" and "-0.50 BLEU (mean of 3 draws" in unpruned.study  # 49.5 - 50
    assert control.verdict == "no" and "-1.50 BLEU" in control.study  # 49.5 - 51: beyond 1 BLEU, curve flat
    assert unpruned.evidence == ("fine-tuned 500 updates = 10.2 epochs (the model trained 490 updates, 10 epochs; "
                                 "the paper: 30 epochs); 3 draws (the paper: 3)")
    # the spread over draws is the sample standard deviation, as the budgets' console prints it
    sample_std = f"std {numpy.std([49.5, 49.6, 49.4], ddof=1):.2f})"
    assert sample_std == "std 0.10)" and sample_std in unpruned.study and sample_std in control.study


def test_the_recovery_curve_table_gives_the_sample_standard_deviation_over_draws():
    from fairseq_headprune.study.budhraja.records import FinetuneRecord
    from fairseq_headprune.study.budhraja.report import recovery_curve_rows

    finals = (49.5, 49.6, 49.4)
    records = level_records(after=finals, curve=None)
    for data, final in zip(records[1:], finals):
        data["curve"] = points(40.0 + final - 49.5, final)
        for point in data["curve"]:
            point["gap_vs_control"] = point["score"] - 51.0
    (budget, rows), = recovery_curve_rows([FinetuneRecord.from_dict(data) for data in records])
    gaps = [final - 51.0 for final in finals]
    assert budget == "60%" and rows[-1]["draws"] == 3
    assert rows[-1]["mean"] == pytest.approx(numpy.mean(gaps)) and rows[-1]["std"] == pytest.approx(
        numpy.std(gaps, ddof=1))


def test_a_short_finetune_or_fewer_draws_than_the_paper_are_inconclusive():
    short = row_starting(judged(level_records(updates=40)), "60% of the heads pruned at random, fine-tuned, lose "
                                                            "little against the unpruned model fine-tuned alike")
    assert short.verdict == "inconclusive" and "under half of the model's own 490" in short.rule
    one = row_starting(judged(level_records(after=(45.0,))), "60% of the heads")
    assert one.verdict == "inconclusive" and "1 draw, the paper averages 3" in one.rule


def test_a_no_whose_gap_still_closes_is_inconclusive():
    closing = points(10.0, 30.0, 40.0, 44.0, 48.0)  # gap to the control: -21 at 250 updates, -3 at 500
    rows = judged(level_records(after=(48.0, 48.0, 48.0), curve=closing))
    control = row_starting(rows, "60% of the heads pruned at random, fine-tuned, lose little against the unpruned "
                                 "model fine-tuned alike")
    assert control.verdict == "inconclusive" and "still closing" in control.rule
    flat = points(10.0, 47.0, 48.0, 48.0, 48.0)
    rows = judged(level_records(after=(48.0, 48.0, 48.0), curve=flat))
    assert row_starting(rows, "60% of the heads pruned at random, fine-tuned, lose little against the unpruned "
                              "model fine-tuned alike").verdict == "no"


def test_tables_2_and_3_are_judged_within_each_table():
    def table2(level, kept, pruned):
        return [record(f"k{level}", f"kept {level}", "per-layer", level, kept, tables=(2,), level=level,
                       arm="important layers kept"),
                record(f"p{level}", f"pruned {level}", "per-layer", level, pruned, tables=(2,), level=level,
                       arm="important layers pruned")]

    def table3(level, es, ed, ds):
        return [record(f"{arm}{level}", f"({arm} {level})", "per-type", level, score, tables=(3,), level=level,
                       arm=f"fewest in {arm}") for arm, score in (("ES", es), ("ED", ed), ("DS", ds))]

    control = record("control", "unpruned (control)", "control", 0.0, 51.0, before=50.0)
    # two budgets of 48% by rounding (a Table 2 and a Table 3 one) are never compared with each other
    similar = [control, *table2(25, 49.0, 48.5), *table2(50, 47.0, 46.6), *table3(48, 40.0, 47.0, 46.0),
               *table3(60, 45.0, 40.0, 44.5)]
    rows = judged(similar)
    assert row_starting(rows, "keeping or pruning the layers called important").verdict == "inconclusive"  # 1 draw
    table_2 = row_starting(rows, "keeping or pruning the layers called important")
    assert "25% +0.50, 50% +0.40" in table_2.study
    table_3 = row_starting(rows, "no consistent preference between per-type budgets")
    assert "48% ED, 60% ES" in table_3.study and "fewest in ES at none" in table_3.paper
    assert "within max(1 BLEU, twice the larger std over draws)" in table_2.rule
    # three draws of every budget: judged; fewest-in-DS best at both levels by far is a consistent preference
    drawn = [control] + [dict(item, name=f"{item['name']}.{draw}", label=f"{item['label']} draw {draw}",
                              budget=item["label"])
                         for item in [*table2(25, 49.0, 48.5), *table3(48, 40.0, 41.0, 46.0),
                                      *table3(60, 38.0, 37.0, 44.5)] for draw in (1, 2, 3)]
    rows = judged(drawn)
    assert row_starting(rows, "keeping or pruning the layers called important").verdict == "yes"
    assert row_starting(rows, "no consistent preference between per-type budgets").verdict == "no"


def test_the_bert_claims_judge_strategies_and_figure_2_on_tables_5_and_6():
    def strategy(label, score, tables=(5,), spread=0.05):
        return record(label, label, "layers", 33.3, score, tables=tables, spread=spread, updates=3750, trained=3750,
                      epochs=6)

    control = record("control", "unpruned (control)", "control", 0.0, 51.0, before=50.0, updates=3750,
                     trained=3750, epochs=6, spread=0.5)
    records = [control, strategy("middle:2", 45.0), strategy("top+bottom:2", 47.0), strategy("middle:4", 40.0),
               strategy("top+bottom:4", 44.0), strategy("top:3", 46.0, (5, 6)), strategy("bottom:3", 43.0, (5, 6)),
               strategy("odd", 47.5, (6,), spread=0.08), strategy("even", 44.0, (6,))]
    rows = judged(records, bert=True)
    middle = row_starting(rows, "pruning the middle layers hurts more")
    assert middle.verdict == "yes" and "middle worse in 2 of 2 pairs" in middle.study
    assert row_starting(rows, "no preference between pruning top and bottom").verdict == "no"  # K=3: +3.00 only
    assert row_starting(rows, "pruning alternate layers is better").verdict == "yes"  # 47.5 > 46, 43
    figure = row_starting(rows, "the unpruned heads of all layers compensate alike")
    assert figure.verdict == "yes" and "8% (`odd`)" in figure.study  # the control's 50% prunes no layer
    # the same records on a translation model: Figure 2 is shown per attention type, not judged
    for item in records:
        item["layer_spreads"] = {"enc-enc": 0.2, "dec-dec": 0.4}
    extension = row_starting(judged(records), "the layers of each attention type compensate alike")
    assert extension.verdict is None and "enc-enc 20%, dec-dec 40%" in extension.study


def test_importance_against_random_after_finetuning_is_an_extension_not_a_verdict():
    records = level_records(percent=50.0) + [
        record("imp", "all importance 50%", "curve step", 50.0, 50.5, before=47.9, budget="all importance 50%")]
    extension = row_starting(judged(records), "50% pruned by importance against at random, fine-tuned alike")
    assert extension.verdict is None and "importance 50.50, random 49.50" in extension.study


def test_the_findings_table_shows_every_verdict_and_its_evidence():
    rows = list(judged(level_records(updates=40)).values())
    table = markdown_findings(rows)
    assert "| protocol and evidence |" in table and "| inconclusive |" in table
    assert table.count("\n") == len(rows) + 2
