"""The public API: the package faces' ``__all__``, resolved lazily, without fairseq for the plain logic."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fairseq_headprune
from fairseq_headprune import engine, study

REPO = Path(__file__).resolve().parent.parent


def _fresh(script: str) -> str:
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_importing_the_package_and_its_plain_names_imports_no_fairseq():
    loaded = _fresh(
        "import sys\n"
        "import fairseq_headprune as fh\n"
        "from fairseq_headprune import parse_head_mask, paired_bootstrap, paper_budgets, measure_compensation\n"
        "from fairseq_headprune.study import *\n"
        "print(sorted(m for m in sys.modules if m == 'fairseq' or m.startswith('fairseq.')))")
    assert loaded == "[]"


@pytest.mark.parametrize("face, exports", [(fairseq_headprune, fairseq_headprune._EXPORTS), (study, study.EXPORTS),
                                           (engine, engine.EXPORTS)], ids=["root", "study", "engine"])
def test_every_public_name_is_its_modules_object(face, exports):
    assert set(face.__all__) - {"__version__"} == set(exports)
    for name, module in exports.items():
        assert getattr(face, name) is getattr(importlib.import_module(module), name), name
    assert set(face.__all__) <= set(dir(face))
    with pytest.raises(AttributeError, match="no_such_name"):
        face.no_such_name


def test_the_root_offers_both_faces_and_the_errors():
    assert (set(study.__all__) | set(engine.__all__) | {"HeadPruneError", "__version__"}
            <= set(fairseq_headprune.__all__))
    assert issubclass(fairseq_headprune.SettingsError, fairseq_headprune.HeadPruneError)


def test_the_python_api_page_imports_only_the_public_faces():
    page = (REPO / "docs" / "python-api.md").read_text(encoding="utf-8")
    code = "\n".join(re.findall(r"```python\n(.*?)```", page, flags=re.S))
    imports = re.findall(r"^\s*(?:from|import) (fairseq_headprune[\w.]*)", code, flags=re.M)
    assert imports and set(imports) <= {"fairseq_headprune", "fairseq_headprune.study", "fairseq_headprune.engine"}


def test_the_plain_api_round_trips_a_spec_without_a_model():
    from fairseq_headprune import head_mask_to_spec, parse_head_mask, parse_layer_strategy, strategy_mask

    layout = {"enc-enc": (12, 12)}
    assert head_mask_to_spec(parse_head_mask("E:1:6 E:2:keep=1,3", layout)) == "E:1:6 E:2:keep=1,3"
    assert head_mask_to_spec(strategy_mask(parse_layer_strategy("middle:2", layout), layout)) == "E:6:* E:7:*"


def test_the_python_api_pages_plain_example_runs_as_written():
    """The page's model-free block runs, and its commented results are what it gives."""
    page = (REPO / "docs" / "python-api.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "paper_budgets(" in b)
    namespace = {}
    for line in block.splitlines():
        code, _, comment = line.partition("  # ")
        if code.startswith(("from", "layout")) or not comment:
            exec(code, namespace)
        else:
            assert repr(eval(code, namespace)) == comment.strip().split("  ")[0], line
