"""fairseq-headprune: a fairseq plugin to mask, score and prune attention heads."""

import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "fairseq_headprune", "version.py"), encoding="utf-8") as stream:
    VERSION = re.search(r'__version__ = "([^"]+)"', stream.read()).group(1)

setup(
    name="fairseq-headprune",
    version=VERSION,
    description=(
        "Which attention heads does a trained fairseq Transformer need? "
        "Head masking, importance, ablation and pruning (Michel et al. 2019)."
    ),
    long_description=(
        "A fairseq plugin (--user-dir) that masks, scores, ablates and prunes the attention heads of "
        "fairseq Transformers (translation, RoBERTa classifiers, transformer_lm), reproducing Michel, "
        "Levy & Neubig (2019), 'Are Sixteen Heads Really Better than One?', and Budhraja et al. (2020), "
        "with significance tests, Fisher search, mask tuning, learned gates and real head removal.\n\n"
        "fairseq itself is not installed over yours: install it yourself, or use the `fairseq` extra "
        "(`pip install fairseq-headprune[fairseq]`, ve-fairseq on Python >= 3.11).\n"
    ),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.9",
    packages=find_packages(include=["fairseq_headprune", "fairseq_headprune.*"]),
    # ranges, not pins: an installation keeps the user's torch and fairseq; the exact versions
    # the tests run with are in constraints.txt
    install_requires=[
        "torch>=2.0",
        "numpy>=1.21",
        "sacrebleu>=2.3",
        "sacremoses>=0.0.53",
        "subword-nmt>=0.3.8",
        "compare-mt>=0.2.10",
        # compare-mt imports six without declaring it
        "six>=1.16",
        "scipy>=1.10",
        "matplotlib>=3.7",
        "tqdm>=4.60",
    ],
    extras_require={
        # official fairseq 0.12.2 fails to import on Python >= 3.11 (dataclass mutable defaults)
        "fairseq": ["fairseq>=0.12.2; python_version < '3.11'", "ve-fairseq>=0.12.3; python_version >= '3.11'"],
        "ctranslate2": ["ctranslate2>=4.0"],
        "test": ["pytest>=7", "pytest-xdist>=3", "ruff>=0.6"],
    },
    entry_points={"console_scripts": ["fairseq-headprune=fairseq_headprune.cli:main"]},
    classifiers=[
        "License :: OSI Approved :: MIT License",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
