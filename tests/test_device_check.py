"""The quick GPU check (scripts/dev/device_check.py, gpu_check.sh --quick) on the CPU path, on the tiny model.

prepare_gpu_check.sh runs this file to train the cache the GPU check reads and to see the check work there.
"""

import json
import sys

from conftest import REPO, run


def test_the_quick_check_passes_on_the_cpu_path(tiny_model, tmp_path):
    report = tmp_path / "check.json"
    result = run([sys.executable, REPO / "scripts" / "dev" / "device_check.py", "--cache", tiny_model["root"],
                  "--device", "cpu", "--json", report], check=False)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    checks = json.loads(report.read_text())["checks"]
    names = [c["check"] for c in checks]
    for attention_type in ("enc-enc", "enc-dec", "dec-dec"):
        for precision in ("fp32", "fp16"):
            assert sum(attention_type in n and n.endswith(precision) for n in names) == 1
    assert all(c["passed"] for c in checks) and len(checks) == 8
    masked = [c for c in checks if c["check"].startswith("masked")]
    assert all(c["max_logit_difference"] * 100 < c["mask_effect"] for c in masked)  # the masks did something
    finetune = checks[-1]
    assert finetune["masked_heads_unchanged"] is True and finetune["largest_update"] > 0
    assert "8 of 8 checks passed" in result.stdout


def test_the_quick_check_refuses_an_empty_cache(tmp_path):
    result = run([sys.executable, REPO / "scripts" / "dev" / "device_check.py", "--cache", tmp_path,
                  "--device", "cpu"], check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"device_check: error: no tiny model in {tmp_path} (prepare it on any machine: "
        "bash scripts/dev/prepare_gpu_check.sh DIR)"]
