"""The user documentation holds together: the README's commands are the ones CI and the demo run,
every relative link and anchor resolves, every figure exists."""

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "data" / "README.md", *sorted((REPO / "docs").glob("*.md")),
         *sorted((REPO / "scripts").rglob("README.md"))]


def _headings(path: Path):
    """GitHub's anchors of a Markdown file's headings (outside code blocks)."""
    anchors, in_code = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (match := re.match(r"^#+ (.*)", line)):
            anchors.add(re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-"))
    return anchors


def _links(path: Path):
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"^[a-z]+://", target)]


def test_the_readme_stays_short_and_keeps_the_two_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 300
    commands = [line.split("#")[0].strip() for line in readme.splitlines()]
    assert "bash scripts/demos/run_demo.sh" in commands
    assert "bash scripts/dev/run_tests.sh" in commands


def test_ci_runs_the_readmes_test_command():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    runs = [shlex.split(line) for line in ci.splitlines() if line.strip().startswith("bash scripts/dev/run_tests.sh")]
    assert runs and runs[0][:2] == ["bash", "scripts/dev/run_tests.sh"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _headings(resolved):
            broken.append(f"{target}: no such heading")
    assert broken == []


def test_the_study_pages_exist():
    for name in ("installation", "data", "masking", "importance", "ablation", "pruning", "search",
                 "removal-and-export", "dynamics", "sharding", "classifiers", "language-models", "python-api",
                 "reproductions", "benchmarks", "development", "cli"):
        assert (REPO / "docs" / f"{name}.md").is_file(), name
