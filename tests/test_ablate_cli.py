"""`fairseq-headprune ablate` and `significance` on the tiny trained model."""

import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import BIN_DIR, REPO, USER_DIR, run

HEADS = "E:1:1-2 A:2:3-4 D:1:5"  # five single-head configurations
# every sentence scored: fairseq-generate otherwise leaves out the last (sentences mod 8)
GENERATION = ["--beam", "5", "--batch-size", "64", "--required-batch-size-multiple", "1"]


def ablate(tiny_model, out_dir, *extra, check=True):
    return run(
        ["fairseq-headprune", "ablate", tiny_model["data"], "--path", tiny_model["checkpoint"],
         "--gen-subset", "valid", "--out-dir", out_dir, "--no-progress", *GENERATION, *extra],
        check=check,
    )


@pytest.fixture(scope="module")
def single_sweep(tiny_model, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ablate") / "single"
    console = ablate(tiny_model, out_dir, "--heads", HEADS).stdout
    with open(out_dir / "single.json") as stream:
        table = json.load(stream)
    table["console"] = console
    return out_dir, table


def fairseq_generate(tiny_model, spec):
    result = run(
        ["fairseq-generate", tiny_model["data"], "--path", tiny_model["checkpoint"], "--user-dir", USER_DIR,
         "--task", "fairseq-headprune", "--gen-subset", "valid", "--head-mask", spec, *GENERATION]
    )
    hypotheses = {}
    for line in result.stdout.splitlines():
        if line.startswith("H-"):
            key, _, text = line.split("\t")
            hypotheses[int(key[2:])] = text
    bleu = float(re.search(r"BLEU4 = ([\d.]+)", result.stdout).group(1))
    return bleu, [hypotheses[i] for i in sorted(hypotheses)]


def stored(out_dir, name):
    with open(out_dir / "sweeps" / "valid" / "configs" / f"{name}.json") as stream:
        return json.load(stream)


def test_sweep_matches_fairseq_generate(tiny_model, single_sweep):
    out_dir, table = single_sweep
    rows = {row["config"]: row for row in table["rows"]}
    assert len(rows) == 5
    for name, spec in [("baseline", "none"), ("single.enc-dec.L2.H3", "A:2:3"), ("single.dec-dec.L1.H5", "D:1:5")]:
        bleu, hypotheses = fairseq_generate(tiny_model, spec)
        result = stored(out_dir, name)
        assert result["spec"] == spec
        assert result["hypotheses"] == hypotheses
        assert round(result["bleu"], 2) == bleu
        if name != "baseline":
            assert rows[name]["bleu"] == result["bleu"]
            assert rows[name]["delta"] == pytest.approx(result["bleu"] - table["settings"]["baseline_bleu"])
    for row in table["rows"]:
        assert 0.0 <= row["p_value"] <= 1.0 and row["significant"] == (row["p_value"] < 0.01)
    assert table["settings"]["test"] == {
        "test": "bootstrap", "samples": 1000, "seed": 12345, "sample_ratio": 1.0, "alpha": 0.01
    }
    for suffix in (".tsv", ".md", ".tex", "_delta.png", "_hist.png"):
        assert (out_dir / f"single{suffix}").stat().st_size > 0
    # the console names the largest drop by the head's --head-mask spec
    worst = min(table["rows"], key=lambda row: row["delta"])
    assert f"largest drop  {worst['delta']:+.2f}  {worst['spec']} (p" in table["console"], table["console"]


def test_killed_sweep_resumes_to_the_same_table(tiny_model, single_sweep, tmp_path):
    reference_dir, _ = single_sweep
    out_dir = tmp_path / "resumed"
    command = [
        str(BIN_DIR / "fairseq-headprune"), "ablate", str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]),
        "--gen-subset", "valid", "--out-dir", str(out_dir), "--no-progress", *GENERATION, "--heads", HEADS,
    ]
    env = dict(os.environ, PATH=f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}")
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    configs = out_dir / "sweeps" / "valid" / "configs"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if configs.is_dir() and len(list(configs.glob("*.json"))) >= 2:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the sweep finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    done_before = {p.name for p in configs.glob("*.json")}
    assert all(json.loads((configs / name).read_text())["name"] for name in done_before)  # complete files
    assert 2 <= len(done_before) < 6 and not (out_dir / "single.tsv").exists()

    mtimes = {p.name: p.stat().st_mtime_ns for p in configs.glob("*.json")}
    ablate(tiny_model, out_dir, "--heads", HEADS)
    after = {p.name for p in configs.glob("*.json")}
    assert len(after) == 6 and done_before <= after
    # finished configurations were kept, not translated again
    assert all((configs / name).stat().st_mtime_ns == mtimes[name] for name in done_before)
    assert not [p for p in configs.iterdir() if p.name.startswith(".tmp-")]
    assert (out_dir / "single.tsv").read_text() == (reference_dir / "single.tsv").read_text()
    assert (out_dir / "single.md").read_text() == (reference_dir / "single.md").read_text()


def test_other_sweep_in_the_same_directory_is_refused(tiny_model, single_sweep):
    out_dir, _ = single_sweep
    before = {p: p.read_bytes() for p in out_dir.glob("single.*")}
    result = ablate(tiny_model, out_dir, "--heads", HEADS, "--beam", "2", check=False)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()
    assert len(message) == 1 and "holds another run's results (--beam '5' there, '2' now)" in message[0]
    assert {p: p.read_bytes() for p in out_dir.glob("single.*")} == before


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--gen-subset", "nosuchsplit"], "split 'nosuchsplit' not found"),
        (["--heads", "E:9:1"], "--heads: layer 9 out of range"),
        (["--mode", "cross-domain"], "needs --cross-subset"),
        (["--beam", "five"], "fairseq option: argument --beam"),
        (["--samples", "0"], "resamples must be positive"),
    ],
)
def test_bad_ablate_input_is_one_line(tiny_model, tmp_path, extra, message):
    result = ablate(tiny_model, tmp_path / "out", *extra, check=False)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "Warning" not in line and "warn" not in line]
    errors = [line for line in lines if "error" in line]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_all_but_one_with_selection_on_another_split(tiny_model, tmp_path):
    out_dir = tmp_path / "keep"
    result = ablate(tiny_model, out_dir, "--mode", "all-but-one", "--types", "enc-dec", "--select-subset", "test")
    with open(out_dir / "all_but_one.json") as stream:
        rows = json.load(stream)["rows"]
    with open(out_dir / "all_but_one_best.json") as stream:
        best = json.load(stream)["rows"]
    assert len(rows) == 2 * 8 and {r["attention_type"] for r in rows} == {"enc-dec"}
    assert len(best) == 2
    for entry in best:
        layer_rows = [r for r in rows if r["layer"] == entry["layer"]]
        assert entry["bleu"] == max(r["bleu"] for r in layer_rows)
        # the best head's paired-test interval travels with it: the findings judge each layer by it
        own = next(r for r in layer_rows if r["head"] == entry["head"])
        assert entry["delta_low"] == own["delta_low"] <= entry["delta"] <= entry["delta_high"] == own["delta_high"]
        chosen = next(r for r in layer_rows if r["head"] == entry["selected_head"])
        assert entry["selected_delta"] == chosen["delta"] <= entry["delta"]
    # the head chosen on the other split is that split's best
    test_rows = [
        json.load(open(p)) for p in (out_dir / "sweeps" / "test" / "configs").glob("keep.*.json")
    ]
    for entry in best:
        candidates = [r for r in test_rows if r["labels"]["layer"] == entry["layer"]]
        top = max(r["bleu"] for r in candidates)
        assert any(r["labels"]["head"] == entry["selected_head"] and r["bleu"] == top for r in candidates)
    assert "chosen on test" in result.stdout
    assert (out_dir / "all_but_one_best.md").read_text().count("| ") > 3


def test_cross_domain_correlation(tiny_model, tmp_path):
    from scipy import stats

    out_dir = tmp_path / "cross"
    ablate(tiny_model, out_dir, "--mode", "cross-domain", "--cross-subset", "test1", "--heads", "A:*:1-3 D:2:1-2")
    with open(out_dir / "cross_domain.json") as stream:
        table = json.load(stream)
    rows = table["rows"]
    assert len(rows) == 8
    with open(out_dir / "single.test1.json") as stream:
        shifted = {r["config"]: r["delta"] for r in json.load(stream)["rows"]}
    assert [r["cross_delta"] for r in rows] == [shifted[r["config"]] for r in rows]
    r, p = stats.pearsonr([row["delta"] for row in rows], [row["cross_delta"] for row in rows])
    assert table["settings"]["pearson_r"] == pytest.approx(r)
    assert table["settings"]["pearson_p"] == pytest.approx(p)
    assert (out_dir / "cross_domain.png").stat().st_size > 0


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_significance_command_reproduces_compare_mt(tiny_model, single_sweep, tmp_path):
    from compare_mt.scorers import BleuScorer
    from compare_mt.sign_utils import eval_with_paired_bootstrap

    out_dir, _ = single_sweep
    with open(out_dir / "sweeps" / "valid" / "sweep.json") as stream:
        references = json.load(stream)["references"]
    ref = _write(tmp_path / "ref.txt", references)
    base = _write(tmp_path / "base.txt", stored(out_dir, "baseline")["hypotheses"])
    system_lines = stored(out_dir, "single.enc-dec.L2.H3")["hypotheses"]
    system = _write(tmp_path / "sys.txt", system_lines)
    result = run(
        ["fairseq-headprune", "significance", ref, base, system, "--test", "compare-mt", "--test-seed", "7",
         "--samples", "500", "--json", tmp_path / "out.json"]
    )
    with open(tmp_path / "out.json") as stream:
        (row,) = json.load(stream)["rows"]
    split = lambda lines: [line.strip().split(" ") for line in lines]  # noqa: E731
    np.random.seed(7)
    wins, _ = eval_with_paired_bootstrap(
        split(references), [split(base.read_text().splitlines()), split(system_lines)], None, BleuScorer(),
        num_samples=500,
    )
    assert [row["baseline_wins"], row["system_wins"], row["ties"]] == wins[0]
    assert "compare-mt test, 500 resamples" in result.stdout


def test_significance_command_bad_input(tmp_path):
    ref = _write(tmp_path / "ref.txt", ["a b c", "d e f"])
    base = _write(tmp_path / "base.txt", ["a b c", "d e f"])
    short = _write(tmp_path / "short.txt", ["a b c"])
    result = run(["fairseq-headprune", "significance", ref, base, short], check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"fairseq-headprune significance: error: {short} has 1 lines but the reference {ref} has 2"
    )
    missing = run(["fairseq-headprune", "significance", ref, base, tmp_path / "nope.txt"], check=False)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "cannot read" in missing.stderr
