"""A vocabulary map for CTranslate2: which target tokens a source sentence may produce (plain; no fairseq).

In beam search the output projection and its softmax run over the whole
target vocabulary for every generated token of every beam row; on a small
model they cost about as much as all the layers together, and no head or
neuron pruning touches them. CTranslate2 can restrict them to a batch's
candidates (``translate_batch(use_vmap=True)`` with the model's ``vmap.txt``,
the file its converters take as ``--vocab_mapping``): the candidates of
every source token of the batch, plus tokens that are always candidates. Its
own benchmark reports 1.31x on top of int8 for a vocabulary map.

The map is built from the training pairs: a source token's candidates are the
target tokens that co-occur with it most strongly over the sentence pairs
(Dice's coefficient, 2 c(s, t) / (c(s) + c(t)), counting each token once per
sentence), and the most frequent target tokens are always candidates. Its
coverage (the share of a split's reference tokens that are among their
sentence's candidates) says what the map can cost: a reference token outside
the candidates cannot be produced.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Sequence, Tuple

from fairseq_headprune.errors import SettingsError

DEFAULT_CANDIDATES_PER_TOKEN = 20
DEFAULT_COMMON_TOKENS = 100

Pair = Tuple[Sequence[str], Sequence[str]]  # a sentence pair's source and target tokens


@dataclass
class VocabularyMap:
    """Each source token's candidates and the tokens that are always candidates."""

    candidates: Dict[str, List[str]]
    common: List[str]
    settings: Dict[str, int] = field(default_factory=dict)

    def sentence_candidates(self, source: Iterable[str]) -> set:
        allowed = set(self.common)
        for token in source:
            allowed.update(self.candidates.get(token, ()))
        return allowed

    def lines(self) -> List[str]:
        """CTranslate2's format: ``n-gram <tab> candidates``; the empty n-gram's candidates are always allowed."""
        lines = ["\t" + " ".join(self.common)]
        lines += [f"{token}\t{' '.join(targets)}" for token, targets in sorted(self.candidates.items()) if targets]
        return lines


def build_vocabulary_map(pairs: Iterable[Pair], per_token: int = DEFAULT_CANDIDATES_PER_TOKEN,
                         common: int = DEFAULT_COMMON_TOKENS) -> VocabularyMap:
    """The map of the training ``pairs``: each source token's ``per_token`` target tokens of highest Dice
    coefficient, and the ``common`` most frequent target tokens (see the module)."""
    if per_token < 1 or common < 0:
        raise SettingsError(f"a vocabulary map needs at least one candidate per token and no negative count of "
                            f"common tokens, got {per_token} and {common}")
    source_counts: Counter = Counter()
    target_counts: Counter = Counter()
    target_frequency: Counter = Counter()
    together: Dict[str, Counter] = {}
    for source, target in pairs:
        sources, targets = set(source), set(target)
        source_counts.update(sources)
        target_counts.update(targets)
        target_frequency.update(target)
        for token in sources:
            together.setdefault(token, Counter()).update(targets)
    if not source_counts:
        raise SettingsError("a vocabulary map needs training pairs; the training split has none")
    candidates = {}
    for token, counts in together.items():
        scored = sorted(counts.items(),
                        key=lambda item: (-2.0 * item[1] / (source_counts[token] + target_counts[item[0]]), item[0]))
        candidates[token] = [target for target, _ in scored[:per_token]]
    always = [token for token, _ in sorted(target_frequency.items(), key=lambda item: (-item[1], item[0]))[:common]]
    return VocabularyMap(candidates, always, {"per_token": per_token, "common": common})


def vocabulary_map_coverage(vocabulary_map: VocabularyMap, pairs: Iterable[Pair]) -> float:
    """The share of the pairs' target tokens that are among their sentence's candidates."""
    covered = total = 0
    for source, target in pairs:
        allowed = vocabulary_map.sentence_candidates(source)
        covered += sum(token in allowed for token in target)
        total += len(target)
    return covered / total if total else 1.0
