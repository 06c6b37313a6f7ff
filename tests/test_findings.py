"""The report's verdicts on the papers' findings follow from the numbers, by the stated rules."""

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
    return {row[0].split(" (")[0]: row[-1] for row in rows}, rows


def test_verdicts_follow_the_numbers():
    found, rows = verdicts(study())
    assert found["masking one head at a time rarely hurts significantly"] is True  # 2 of 8 significant
    assert found["a head's effect correlates across domains"] is True
    assert found["a share of the heads can be pruned with little loss"] is True  # 49 >= 0.95 * 50
    assert found["importance is a better pruning order than single-head ablation scores"] is True
    # un-fine-tuned random pruning is shown, not judged: the paper compares only after fine-tuning
    assert found["random pruning against importance"] is None
    assert found["Enc-Dec attention is the most sensitive to pruning"] is True
    # findings without result files are left out, not guessed
    assert not any("training" in row[0] or "budget" in row[0] for row in rows)
    table = markdown_findings(rows)
    assert table.count("\n") == len(rows) + 2 and "not judged" in table
    assert "random within about 1 BLEU" not in table  # not a claim of the paper


def test_the_other_numbers_give_the_other_verdicts():
    found, _ = verdicts(study(importance_at_50=21.0, enc_dec_last=48.0, r=0.3))
    assert found["Enc-Dec attention is the most sensitive to pruning"] is False
    assert found["a head's effect correlates across domains"] is False


def test_a_classifier_is_held_to_the_bert_findings_and_an_lm_to_none():
    """The metric recorded in the result files decides: accuracy -> BERT's statements at 40%; perplexity -> none."""
    payloads = study()
    curves = payloads["pruning/prune_curves.all.json"]
    curves["settings"] = {"metric": "accuracy", "baseline_accuracy": 50.0}
    for row in curves["rows"]:
        row["accuracy"], row["accuracy_std"] = row.pop("bleu"), row.pop("bleu_std")
    curves["rows"].append({"order": "importance", "percent": 40, "accuracy": 47.0, "accuracy_std": 0.0, "draws": 1})
    found, rows = verdicts(payloads)
    share = next(row for row in rows if row[0].startswith("a share of the heads"))
    assert share[1] == "40% of the heads pruned by importance with no noticeable loss"
    assert share[2] == "40% pruned by importance: accuracy 47.00 (94% of 50.00)" and share[-1] is False
    assert "most of the 144 heads" in next(row for row in rows if row[0].startswith("masking one head"))[1]
    curves["settings"] = {"metric": "ppl", "baseline_ppl": 50.0}
    assert paper_findings(payloads.get) == []


def write(path, payload):
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


def test_the_report_reads_the_speed_benchmark_and_the_comparison_of_pruning_methods(tmp_path):
    from fairseq_headprune.study.methods.comparison import goal_check
    from fairseq_headprune.study.output.report import write_report

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
                                 "fisher-rearranged+tuned": {"seconds": 9.0, "sentences": 500, "tuning_sentences": 400}}}
    write(tmp_path / "comparison" / "prune_curves.all.json", {"settings": settings, "rows": rows})
    text = open(write_report(str(tmp_path))).read()
    assert "| 36 of 72 | 64 | 1.00 | 1.10 | 0.77 | 1.30x | yes | 100 → 80 |" in text
    # loss 8 against 20 at 50%: 0.40 of it (met); worse at 70% (9 < 10)
    assert "0.40 of its loss (goal: at most half: met)" in text and "NOT met (worse at 71%)" in text
    assert "| Fisher search + rearrangement + mask tuning | 9.0 | 500 | 400 |" in text
    goal = goal_check(rows, 50.0)
    assert goal["loss_tuned"] == 8.0 and goal["loss_reference"] == 20.0 and goal["levels_worse"] == [70.8]
    assert goal["levels_compared"] == [11.1, 50.0, 70.8]  # 0% and 90% are outside 10-70%


def finetuned_records(level_after=-0.5, level_before=-20.0, budgets_after=(40.0, 39.5), middle=(30.0, 35.0)):
    """finetune/results.json of a study with a 60% level (2 draws), two budgets of one level, strategies."""
    def record(name, label, kind, percent, before, after, budget=None, spread=None):
        return {"name": name, "label": label, "kind": kind, "percent": percent, "budget": budget or label,
                "score_before": before, "score_after": after, "finetune": "100 updates", "layer_spread": spread}
    return [
        record("control", "unpruned (control)", "control", 0.0, 50.0, 51.0),
        record("a", "60% draw 1", "level", 61.1, 50.0 + level_before, 51.0 + level_after - 0.1, "60%", 0.05),
        record("b", "60% draw 2", "level", 61.1, 50.0 + level_before, 51.0 + level_after + 0.1, "60%", 0.07),
        record("c", "642 246 642", "per-layer", 50.0, 40.0, budgets_after[0], spread=0.2),
        record("d", "246 642 246", "per-layer", 50.0, 8.0, budgets_after[1], spread=0.3),
        record("e", "middle:2", "layers", 22.2, 20.0, middle[0]),
        record("f", "top+bottom:2", "layers", 22.2, 25.0, middle[1]),
    ]


def test_budhraja_findings_are_judged_on_the_finetuned_configurations():
    payloads = study()
    payloads["pruning/finetune/results.json"] = finetuned_records()
    found, rows = verdicts(payloads)
    by_start = {row[0].split(" (")[0]: row for row in rows}
    level = by_start["randomly pruning 60% of the heads and fine-tuning loses little"]
    assert level[-1] is True and "-0.50 BLEU against the unpruned model fine-tuned alike" in level[2]
    assert "without fine-tuning -20.00 (would not reproduce)" in level[2] and "−0.15" in level[1]
    budgets = by_start["where the kept heads are does not matter after fine-tuning"]
    assert budgets[-1] is True and "0.50 BLEU at 50%" in budgets[2] and "the verdict differs" in budgets[2]
    assert by_start["pruning the middle layers hurts more than as many top and bottom layers"][-1] is True
    compensation = by_start["the unpruned heads of all layers compensate alike during fine-tuning"]
    assert compensation[-1] is False and "median 14% over 4" in compensation[2]  # 5%, 7%, 20%, 30%: 13.5%


def test_budhraja_findings_fail_on_the_other_numbers():
    payloads = study()
    payloads["pruning/finetune/results.json"] = finetuned_records(level_after=-3.0, budgets_after=(45.0, 30.0),
                                                                  middle=(36.0, 35.0))
    found, _ = verdicts(payloads)
    assert found["randomly pruning 60% of the heads and fine-tuning loses little"] is False
    assert found["where the kept heads are does not matter after fine-tuning"] is False
    assert found["pruning the middle layers hurts more than as many top and bottom layers"] is False
