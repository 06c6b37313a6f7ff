"""Installing the package keeps the user's stack: ranges, not pins; fairseq never installed over theirs.

A fresh virtual environment is given the metadata of what this one holds
(no code: pip's resolver reads only metadata), with another compatible torch
(2.6.0) and the user's own fairseq (0.12.2) in place of ours; pip's dry run
must then plan to install this package alone.
"""

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USERS_OWN = {"torch": "2.6.0", "fairseq": "0.12.2"}  # what the user had: a CUDA torch, a fork of fairseq
SKIPPED = {"pip", "setuptools", "wheel", "fairseq-headprune", "ve-fairseq", "torch"}


def _write_metadata(site: Path, name: str, version: str, requires) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {requirement}" for requirement in requires or ()]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "INSTALLER").write_text("pip\n")


@pytest.fixture(scope="module")
def users_venv(tmp_path_factory):
    venv = tmp_path_factory.mktemp("users-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    # building this package's metadata needs a setuptools with bdist_wheel: this environment's
    ours = Path(metadata.distribution("setuptools").locate_file(""))
    for old in list(site.glob("setuptools*")) + list(site.glob("pkg_resources")) + list(site.glob("_distutils_hack")):
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    for part in ("setuptools", "pkg_resources", "_distutils_hack",
                 f"setuptools-{metadata.version('setuptools')}.dist-info"):
        if (ours / part).exists():
            shutil.copytree(ours / part, site / part)
    for distribution in metadata.distributions():
        name = distribution.metadata["Name"]
        if name is None or name.lower() in SKIPPED or (site / name).exists():
            continue
        if not any(site.glob(f"{name.replace('-', '_')}-*.dist-info")):
            _write_metadata(site, name, distribution.version, distribution.requires)
    for name, version in USERS_OWN.items():
        _write_metadata(site, name, version, [])
    return venv


def test_pip_install_keeps_the_users_torch_and_fairseq(users_venv, tmp_path):
    report = tmp_path / "report.json"
    result = subprocess.run(
        [str(users_venv / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
         "--disable-pip-version-check", "--quiet", "--report", str(report), str(REPO)],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    planned = {item["metadata"]["name"]: item["metadata"]["version"]
               for item in json.loads(report.read_text())["install"]}
    assert planned == {"fairseq-headprune": metadata.version("fairseq-headprune")}


def test_the_declared_requirements_are_ranges_and_leave_fairseq_to_an_extra():
    requirements = metadata.requires("fairseq-headprune")
    core = [r for r in requirements if "extra ==" not in r]
    assert not any("==" in r for r in core), core
    assert not any(r.startswith(("fairseq", "ve-fairseq")) for r in core), core
    extras = [r for r in requirements if 'extra == "fairseq"' in r]
    assert any(r.startswith("ve-fairseq") for r in extras) and any(r.startswith("fairseq") for r in extras)


def test_the_constraints_file_pins_what_ci_installs():
    pins = {line.split("==")[0]: line.split("==")[1].split(";")[0].strip()
            for line in (REPO / "constraints.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")}
    for name in ("torch", "sacrebleu", "compare-mt", "numpy"):
        assert metadata.version(name).split("+")[0] == pins[name], name


def _long_description():
    result = subprocess.run([sys.executable, "setup.py", "--long-description"], cwd=REPO,
                            capture_output=True, text=True, check=True)
    return result.stdout


def test_the_long_description_has_no_relative_links_or_images():
    """A package index shows the long description without the repository: a relative link or image breaks there."""
    import re

    text = _long_description()
    assert text.strip()
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)", text) + re.findall(r"""src=["']([^"']+)""", text)
    assert [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*://", t)] == []


def test_the_long_description_renders_as_a_package_index_renders_it():
    markdown = pytest.importorskip("readme_renderer.markdown")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # readme_renderer warns, and renders nothing, without a Markdown backend
        try:
            html = markdown.render(_long_description(), variant="GFM")
        except UserWarning as warning:
            pytest.skip(f"readme_renderer cannot render Markdown here: {warning}")
    assert html and "<p>" in html


def test_the_citation_file_cites_the_software_and_the_papers():
    import yaml

    citation = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    assert citation["cff-version"] and citation["type"] == "software"
    from fairseq_headprune.version import __version__

    assert citation["version"] == __version__
    titles = " | ".join(reference["title"] for reference in citation["references"])
    for title in ("Are Sixteen Heads Really Better than One?",
                  "On the weak link between importance and prunability of attention heads",
                  "A Fast Post-Training Pruning Framework for Transformers"):
        assert title in titles
    assert all(reference.get("authors") and reference.get("year") for reference in citation["references"])
