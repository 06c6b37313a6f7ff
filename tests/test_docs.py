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


ELISION = re.compile(r"^\s*\.\.\. \(.*\)$")  # "... (one line per layer)": lines of a console left out
# a figure: a decimal, a count "N of M", or a number with its unit (× or x, %, minutes), each matched with its unit
FIGURE = re.compile(r"(?<![\w.])(\d+(?:,\d{3})*\.\d+(?![.\d])(?:[×x%](?!\w))?|\d+(?:\.\d+)?[×x%](?!\w)"
                    r"|\d+ minutes|\d+ of (?:the )?\d+)")  # not a version (2.13.0)


def _blocks(path: Path):
    """(is_code, language, lines) for each fenced code block and each run of non-blank lines of prose."""
    blocks, current, language, in_code = [], [], "", False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if in_code:
                blocks.append((True, language, current))
            elif current:
                blocks.append((False, "", current))
            current, language, in_code = [], line[3:].strip(), not in_code
        elif in_code:
            current.append(line)
        elif line.strip():
            current.append(line)
        elif current:
            blocks.append((False, "", current))
            current = []
    if current:
        blocks.append((False, "", current))
    return blocks


def _docs_console_lines():
    lines = set()
    for page in sorted((REPO / "docs").glob("*.md")):
        for is_code, language, block in _blocks(page):
            if is_code:
                lines.update(line.rstrip() for line in block)
    return lines


def test_every_console_block_of_the_readme_is_pasted_in_the_docs():
    """The README quotes consoles; the docs paste them from the named commands' runs."""
    pasted = _docs_console_lines()
    missing = [line for is_code, language, block in _blocks(REPO / "README.md") if is_code and language != "bash"
               for line in block if line.strip() and not ELISION.match(line) and line.rstrip() not in pasted]
    assert not missing, "README console lines pasted nowhere in docs/:\n" + "\n".join(missing)


def _figures(text: str):
    text = re.sub(r"`[^`]*`", "", text)  # commands and specs are not figures
    text = re.sub(r"\]\([^)]*\)", "]", text)  # nor are link targets
    return {match.group(1).replace(",", "").replace(" the ", " ") for match in FIGURE.finditer(text)}


def _stands_in(figure: str, page: str) -> bool:
    """Whether ``figure`` appears in ``page`` as a figure of its own (× and x alike, thousands' commas dropped)."""
    if figure[-1] in "×x":
        pattern = re.escape(figure[:-1]) + "[×x]"
    else:
        pattern = re.escape(figure).replace(r"\ of\ ", " of (?:the )?")
    return re.search(rf"(?<![\w.]){pattern}(?![\d])", page) is not None


def test_every_figure_in_the_readmes_prose_is_in_the_docs_page_it_links():
    """Speed-ups, BLEU, counts and minutes in the README's prose and tables stand in the docs it links (or, where a
    paragraph links none, in some docs page): the README only quotes them."""
    docs = {page.relative_to(REPO).as_posix(): page.read_text(encoding="utf-8").replace(",", "")
            for page in sorted((REPO / "docs").glob("*.md"))}
    blocks = _blocks(REPO / "README.md")
    stray = []
    for index, (is_code, language, lines) in enumerate(blocks):
        if is_code and language != "bash":
            continue  # consoles: the test above
        if is_code:  # a command's comments quote what it prints
            lines = [line.split("#", 1)[1] for line in lines if "#" in line]
        near = "\n".join(line for _, _, block in blocks[max(0, index - 2):index + 1] for line in block)
        linked = [target.split("#")[0] for target in re.findall(r"\]\((docs/[^)#\s]+)", near)]
        pages = [docs[target] for target in linked if target in docs] or list(docs.values())
        for figure in _figures("\n".join(lines)):
            if not any(_stands_in(figure, page) for page in pages):
                stray.append(f"{figure}  (in: {lines[0][:70]}...; looked in {', '.join(linked) or 'every page'})")
    assert not stray, "README figures found in no docs page they link:\n" + "\n".join(sorted(stray))
