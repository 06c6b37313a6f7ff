"""The package's layers, checked from its source and from fresh interpreters.

study/ (plain logic), constants.py and errors.py must import without fairseq;
nothing below commands/ and cli.py may parse or read command-line options;
no command module imports another; no module is over 450 lines.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fairseq_headprune"
PLAIN_MODULES = sorted(
    ["fairseq_headprune.constants", "fairseq_headprune.errors"]
    + [f"fairseq_headprune.study.{p.stem}" for p in (PACKAGE / "study").glob("*.py") if p.stem != "__init__"]
)
COMMAND_LAYER = {PACKAGE / "cli.py"} | set((PACKAGE / "commands").glob("*.py"))
# below the commands, argparse.Namespace is only ever a checkpoint's data type: the
# released (old-format) checkpoints store their configuration as one
CHECKPOINT_FORMAT_MODULES = {"checkpoint_compat.py", "checkpoint_info.py", "legacy_checkpoint.py"}


def package_modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("module", PLAIN_MODULES)
def test_plain_study_modules_import_without_fairseq(module):
    script = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        "loaded = sorted(m for m in sys.modules if m == 'fairseq' or m.startswith('fairseq.'))\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"{module} imports fairseq: {result.stdout.strip()[:200]}"


def test_the_command_line_entry_point_imports_without_fairseq():
    """Parsing options and --help cost no fairseq import; the engine imports it when it loads a model."""
    script = "import sys, fairseq_headprune.cli\nprint(any(m == 'fairseq' for m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr


def _imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, 0
        elif isinstance(node, ast.ImportFrom):
            yield node.module or "", node.level


@pytest.mark.parametrize("path", [p for p in package_modules() if p not in COMMAND_LAYER],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_below_the_commands_handles_command_line_options(path):
    source = path.read_text(encoding="utf-8")
    for forbidden in ("args.", "ArgumentParser", "add_argument", "parse_known_args", "argparse.Namespace)"):
        assert forbidden not in source, f"{path.name} uses {forbidden!r}"
    if path.name not in CHECKPOINT_FORMAT_MODULES:
        assert not any(name == "argparse" for name, _ in _imports(path)), f"{path.name} imports argparse"


def test_layers_import_only_downwards():
    """study/ never imports engine/, modules/, tasks/, criterions/ or commands/; engine/ never commands/."""
    forbidden = {
        "study": ("engine", "modules", "tasks", "criterions", "commands", "cli"),
        "engine": ("commands", "cli"),
        "modules": ("engine", "commands", "cli"),
        "tasks": ("commands", "cli"),
        "criterions": ("commands", "cli"),
    }
    for layer, below in forbidden.items():
        for path in (PACKAGE / layer).glob("*.py"):
            for name, level in _imports(path):
                if level >= 2 or name.startswith("fairseq_headprune."):
                    top = name.replace("fairseq_headprune.", "").split(".")[0]
                    assert top not in below, f"{layer}/{path.name} imports {name}"


def test_no_command_module_imports_another():
    for path in (PACKAGE / "commands").glob("*.py"):
        for name, level in _imports(path):
            if level == 1 and name not in ("common", ""):
                pytest.fail(f"commands/{path.name} imports commands.{name}")


def test_no_module_is_over_450_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in package_modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450}
    assert long == {}
