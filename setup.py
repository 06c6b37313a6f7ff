"""fairseq-headprune: a fairseq plugin to mask, score and prune attention heads."""

from setuptools import find_packages, setup

setup(
    name="fairseq-headprune",
    version="0.1.0",
    description=(
        "Which attention heads does a trained fairseq Transformer need? "
        "Head masking, importance, ablation and pruning (Michel et al. 2019)."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["fairseq_headprune", "fairseq_headprune.*"]),
    install_requires=[
        # The CPU build of 2.13.0 lies on the development machines' disk; the
        # checkpoint allow-list (checkpoint_compat.py) is what torch >= 2.6 needs.
        "torch==2.13.0",
        # Official fairseq 0.12.2 fails to import on Python >= 3.11 (dataclass
        # mutable defaults); ve-fairseq 0.12.3 is a prebuilt wheel of fairseq
        # main that imports and trains there (see README, "Why ve-fairseq").
        "fairseq==0.12.2; python_version < '3.11'",
        "ve-fairseq==0.12.3; python_version >= '3.11'",
        "numpy>=1.21",
        "sacrebleu==2.6.0",
        "sacremoses==0.1.1",
        "subword-nmt==0.3.8",
        "compare-mt==0.2.10",
        # compare-mt imports six without declaring it
        "six>=1.16",
        "scipy>=1.10",
        "matplotlib>=3.7",
        "tqdm>=4.60",
    ],
    extras_require={"test": ["pytest>=7"]},
    entry_points={"console_scripts": ["fairseq-headprune=fairseq_headprune.cli:main"]},
)
