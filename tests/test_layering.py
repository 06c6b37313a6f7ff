"""The package's layers, checked from its source and from fresh interpreters.

Bottom to top: ``constants``, ``errors``, ``corpora/`` and ``study/`` (plain
logic, no fairseq) -> ``compat/``, ``modules/``, ``tasks/``, ``criterions/``
and ``registry`` (fairseq components) -> ``engine/`` -> ``commands/`` and
``cli.py``. Every rule walks the folders recursively; the import graph
(imports inside functions included) must have no cycle.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fairseq_headprune"
NAME = PACKAGE.name


def package_modules():
    return sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_folder(name: str) -> str:
    """``engine`` for fairseq_headprune.engine.x.y, ``cli`` for fairseq_headprune.cli, "" for the root."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


MODULES = {module_name(p): p for p in package_modules()}
PLAIN_MODULES = sorted(
    name for name in MODULES
    if top_folder(name) in ("constants", "errors", "study", "corpora") and not name.endswith("__init__")
)
COMMAND_LAYER = {PACKAGE / "cli.py"} | set((PACKAGE / "commands").rglob("*.py"))
# below the commands, argparse.Namespace is only ever a checkpoint's data type: the
# released (old-format) checkpoints store their configuration as one
CHECKPOINT_FORMAT_MODULES = {PACKAGE / "compat" / "torch_load.py", PACKAGE / "engine" / "checkpoints" / "info.py"}


def imported_modules(path: Path):
    """Every package module ``path`` imports, at the top or inside functions (absolute names)."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == NAME:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != NAME:
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                yield (submodule if submodule in MODULES else target), node.lineno


@pytest.mark.parametrize("module", PLAIN_MODULES)
def test_plain_modules_import_without_fairseq(module):
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


@pytest.mark.parametrize("path", [p for p in package_modules() if p not in COMMAND_LAYER],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_below_the_commands_handles_command_line_options(path):
    source = path.read_text(encoding="utf-8")
    for forbidden in ("args.", "ArgumentParser", "add_argument", "parse_known_args", "argparse.Namespace)"):
        assert forbidden not in source, f"{path.name} uses {forbidden!r}"
    if path not in CHECKPOINT_FORMAT_MODULES:
        tree = ast.parse(source)
        imports = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        imports += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
        assert "argparse" not in imports, f"{path.name} imports argparse"


ERROR_CLASSES = {"HeadPruneError", "HeadMaskError", "CheckpointError", "ResultFileError", "StudyError",
                 "DependencyError", "SettingsError"}


def _message_text(node) -> "tuple[str, bool]":
    """A message's literal text (a formatted value as NUL) and whether it spells a setting's words itself."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, False
    if isinstance(node, ast.JoinedStr):
        parts = [_message_text(value) if isinstance(value, ast.Constant) else
                 ("\0", "setting_words" in ast.unparse(value)) for value in node.values]
        return "".join(p for p, _ in parts), any(spelled for _, spelled in parts)
    if isinstance(node, ast.BinOp):
        (left, a), (right, b) = _message_text(node.left), _message_text(node.right)
        return left + right, a or b
    return "\0", True  # a variable: not checked here


@pytest.mark.parametrize("path", [p for p in package_modules() if p not in COMMAND_LAYER],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_errors_below_the_commands_speak_of_their_settings_in_their_words(path):
    """An error raised below the commands about a setting (``setting=``, or ``refuse``'s third argument) says its
    plain words (``errors.setting_words``: "the budget"), which a command replaces with its user's flag."""
    from fairseq_headprune.errors import setting_words

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        message = setting = None
        if name in ERROR_CLASSES and node.args:
            message, setting = node.args[0], next((k.value for k in node.keywords if k.arg == "setting"), None)
        elif name == "refuse" and len(node.args) >= 3:
            message, setting = node.args[1], node.args[2]
        if setting is None or not isinstance(setting, (ast.Constant, ast.Tuple)):
            continue
        settings = [setting.value] if isinstance(setting, ast.Constant) else [
            e.value for e in setting.elts if isinstance(e, ast.Constant)]
        text, spelled = _message_text(message)
        for one in settings:
            words = setting_words(one)
            assert spelled or words in text or text.startswith(words[:1].upper() + words[1:]), (
                f"{path.name}:{node.lineno}: {one!r} is not said as {words!r} in {text!r}")


# what each folder may not import (recursively, lazy imports included)
FORBIDDEN = {
    "study": ("compat", "modules", "tasks", "criterions", "registry", "engine", "commands", "cli"),
    "corpora": ("compat", "modules", "tasks", "criterions", "registry", "engine", "commands", "cli"),
    "version": ("study", "constants", "errors", "corpora",
                "compat", "modules", "tasks", "criterions", "registry", "engine", "commands", "cli"),
    "constants": ("study", "compat", "modules", "tasks", "criterions", "registry", "engine", "commands", "cli"),
    "errors": ("study", "compat", "modules", "tasks", "criterions", "registry", "engine", "commands", "cli"),
    "compat": ("modules", "tasks", "criterions", "registry", "engine", "commands", "cli"),
    "modules": ("tasks", "criterions", "registry", "engine", "commands", "cli"),
    "tasks": ("registry", "engine", "commands", "cli"),
    "criterions": ("registry", "engine", "commands", "cli"),
    "registry": ("engine", "commands", "cli"),
    "engine": ("commands", "cli"),
}


@pytest.mark.parametrize("path", package_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_layers_import_only_downwards(path):
    layer = top_folder(module_name(path))
    for target, line in imported_modules(path):
        assert top_folder(target) not in FORBIDDEN.get(layer, ()), f"{path.name}:{line} imports {target}"


def test_nothing_imports_the_package_root():
    """Registration goes through ``registry``; the root holds only the version and fairseq's --user-dir hook."""
    for path in package_modules():
        for target, line in imported_modules(path):
            if target == NAME:
                raise AssertionError(f"{path.relative_to(PACKAGE)}:{line} imports the package root")


def test_the_import_graph_has_no_cycle():
    graph = {name: sorted({t for t, _ in imported_modules(path) if t in MODULES and t != name})
             for name, path in MODULES.items()}
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in graph[node]:
            if state.get(target) == "open":
                cycle = stack[stack.index(target):] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_no_command_module_imports_another():
    """A command imports the shared helpers and its own folder's modules (``commands/compress/``: the command
    and its speed-up mode's console), never another command."""
    for path in (PACKAGE / "commands").rglob("*.py"):
        folder = path.parent.relative_to(PACKAGE).as_posix().replace("/", ".")
        own = f"{NAME}.{folder}" if folder != "commands" else None
        for target, line in imported_modules(path):
            if top_folder(target) != "commands" or target in (f"{NAME}.commands.common", f"{NAME}.commands"):
                continue
            if own is None or not (target == own or target.startswith(own + ".")):
                pytest.fail(f"{path.relative_to(PACKAGE)}:{line} imports {target}")


SCRIPTS = PACKAGE.parent / "scripts"
SCRIPT_FILES = sorted(p for p in SCRIPTS.rglob("*") if p.suffix in (".py", ".sh"))


def test_no_module_or_script_is_over_450_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in package_modules() + SCRIPT_FILES
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450}
    assert long == {}


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_function_is_over_100_lines():
    long = [f"{path.relative_to(PACKAGE.parent)}:{line} {name} ({length} lines)"
            for path in package_modules() for name, line, length in _functions(path) if length > 100]
    assert long == []


def test_scripts_import_the_package_and_never_each_other():
    """A script shares code through the package, or through a ``*_support.py`` helper of its own folder (what the
    benchmarks share and the package does not need), never through ``sys.path`` edits or another script."""
    helpers = {p.stem: p.parent for p in SCRIPT_FILES if p.suffix == ".py" and p.stem.endswith("_support")}
    script_names = {p.stem for p in SCRIPT_FILES if p.suffix == ".py"} - set(helpers)
    for path in (p for p in SCRIPT_FILES if p.suffix == ".py"):
        source = path.read_text(encoding="utf-8")
        assert "sys.path" not in source, f"{path.relative_to(SCRIPTS)} edits sys.path"
        tree = ast.parse(source)
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & script_names, f"{path.relative_to(SCRIPTS)} imports {imported & script_names}"
        for helper in imported & set(helpers):
            assert helpers[helper] == path.parent, f"{path.relative_to(SCRIPTS)} imports another folder's {helper}"
        assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree)), path.name


def test_shell_scripts_are_strict_and_print_their_usage():
    """Every script that is run (not sourced) stops on the first error and says how to call it."""
    for path in (p for p in SCRIPT_FILES if p.suffix == ".sh"):
        text = path.read_text(encoding="utf-8")
        if "sourced, not run" in text.split("\n\n")[0] or path.name == "setup_env.sh":
            continue
        assert "set -euo pipefail" in text, f"{path.relative_to(SCRIPTS)} is not strict"
        delegates = re.search(r'^exec bash "\$\(dirname "\$\{BASH_SOURCE\[0\]\}"\)/(\w+\.sh)"', text, re.M)
        assert delegates or "usage" in text, f"{path.relative_to(SCRIPTS)} prints no usage"
