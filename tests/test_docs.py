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
                 "removal-and-export", "compress", "dynamics", "sharding", "classifiers", "language-models",
                 "python-api", "reproductions", "benchmarks", "development", "cli"):
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


# ----------------------------------------------------------------------------- a README a newcomer reads

SENTENCE_WORDS = 40  # the longest prose sentence the README may hold
ABBREVIATIONS = ("e.g.", "i.e.", "et al.", "vs.", "cf.")
# terms a newcomer meets that need a definition: (what a use looks like, what the defining sentence looks like);
# the README's first use of each must be its definition
GLOSSARY = {
    "ξ (a head's mask variable)": (r"ξ|xi_h", r"mask variable ξ"),
    "I_h (importance)": (r"\bI_h\b", r"importance I_h"),
    "spec": (r"\bspecs?\b", r"named by a spec"),
    "paired bootstrap": (r"paired bootstrap", r"paired bootstrap \("),
    "a budget triple such as (15,6,15)": (r"\(\d+,\s?\d+,\s?\d+\)", r"triple such as `\(\d+,\d+,\d+\)`"),
    "a per-layer budget such as 642 246 642": (r"`\d{3} \d{3} \d{3}`", r"per-layer budget such as `\d{3} \d{3} \d{3}`"),
    "the control": (r"\bthe control\b", r"\(the control\)"),
    "vocabulary map": (r"vocabulary[- ]map", r"vocabulary map \("),
    "like for like": (r"like[- ]for[- ]like", r"[Ll]ike for like \("),
    "stock conversion": (r"stock conversion", r"stock conversion \("),
    "decoding FLOPs": (r"decoding[- ]flops", r"decoding FLOPs \("),
    "gettext models": (r"gettext", r"gettext (?:catalogs|message)"),
}


def _readme_text(path: Path = REPO / "README.md") -> str:
    """The README's text."""
    return path.read_text(encoding="utf-8")


def _prose_pieces(text: str):
    """The README's prose: each paragraph or list item, without tables, headings, images and code blocks."""
    text = re.sub(r"```.*?```", "\n\n", text, flags=re.S)
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines()
                 if line.strip() and not line.lstrip().startswith(("|", "#", "![", "<!--"))]
        item: list = []
        for line in lines:
            if re.match(r"\s*(?:[-*]|\d+\.)\s", line) and item:
                yield " ".join(item)
                item = []
            item.append(line.strip())
        if item:
            yield " ".join(item)


def long_sentences(text: str, limit: int = SENTENCE_WORDS):
    """Prose sentences of more than ``limit`` words (inline code and a link count as one word each)."""
    found = []
    for piece in _prose_pieces(text):
        piece = re.sub(r"`[^`]*`", "CODE", piece)
        piece = re.sub(r"\]\([^)]*\)", "]", piece)
        for abbreviation in ABBREVIATIONS:
            piece = piece.replace(abbreviation, abbreviation.replace(".", "·"))
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z(*\[\"])", piece):
            if len(sentence.split()) > limit:
                found.append(f"{len(sentence.split())} words: {sentence[:90]}...")
    return found


def undefined_terms(text: str, glossary=GLOSSARY):
    """Glossary terms whose first use (prose, commands or consoles) comes before their definition, or that are
    used and never defined."""
    found, text = [], re.sub(r"\s+", " ", text)
    for term, (use, definition) in glossary.items():
        first = re.search(use, text, flags=re.I)
        if first is None:
            continue
        defined = re.search(definition, text)
        if defined is None:
            found.append(f"{term}: used ({text[max(0, first.start() - 30):first.end() + 30]!r}), never defined")
        elif first.start() < defined.start():
            found.append(f"{term}: used before its definition: {text[max(0, first.start() - 40):first.end() + 40]!r}")
    return found


VERSION = re.compile(r"fairseq-headprune \d+\.\d+\.\d+")


def consoles_without_version(page: Path):
    """The first line of each pasted console (a ``` block with no language: program output) that names no
    ``fairseq-headprune X.Y.Z``, neither in itself nor in what introduces it (the prose and commands since the
    previous console or heading). A block that is not program output says its language (```text)."""
    pieces, current, language, in_code = [], [], "", False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if in_code:
                pieces.append(("console" if not language else "code", current))
            elif current:
                pieces.append(("prose", current))
            current, language, in_code = [], line[3:].strip(), not in_code
        elif not in_code and line.startswith("#"):
            if current:
                pieces.append(("prose", current))
            pieces.append(("heading", [line]))
            current = []
        else:
            current.append(line)
    missing = []
    for index, (kind, lines) in enumerate(pieces):
        if kind != "console":
            continue
        shown = VERSION.search(" ".join(lines)) is not None
        back = index - 1
        while not shown and back >= 0 and pieces[back][0] not in ("console", "heading"):
            shown = VERSION.search(" ".join(line.strip() for line in pieces[back][1])) is not None
            back -= 1
        first = next((line for line in lines if line.strip()), "")
        if not shown:
            missing.append(f"{page.name}: {first[:80]!r}")
    return missing


def test_no_readme_sentence_runs_over_40_words():
    assert long_sentences(_readme_text()) == []


def test_every_glossary_term_of_the_readme_is_defined_where_it_is_first_used():
    assert undefined_terms(_readme_text()) == []


@pytest.mark.parametrize("page", [p for p in sorted((REPO / "docs").glob("*.md")) if p.name != "cli.md"],
                         ids=lambda p: p.name)  # cli.md is generated: its first line names the version
def test_every_pasted_console_in_docs_carries_its_version(page):
    assert consoles_without_version(page) == []


def test_the_doc_checks_fail_on_planted_cases(tmp_path):
    """Each check finds what it is for: a long sentence, a term used before its definition, a console without a
    version line."""
    long = "This sentence " + "goes on " * 20 + "and ends here."
    assert long_sentences(f"Short. {long} Short again.") and not long_sentences("A short one. Another one.")
    assert undefined_terms("Use the vocabulary map. The vocabulary map (a shortlist) helps.")
    assert not undefined_terms("The vocabulary map (a shortlist) helps. Use the vocabulary map.")
    page = tmp_path / "page.md"
    page.write_text("# A\n\nWhat it printed:\n\n```\nBLEU 1.00\n```\n\n"
                    "# B\n\nWhat it printed (fairseq-headprune 0.3.0):\n\n```bash\ncmd\n```\n\n```\nBLEU 2.00\n```\n")
    assert consoles_without_version(page) == ["page.md: 'BLEU 1.00'"]
