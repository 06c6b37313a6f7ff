"""A seeded synthetic English -> French-like corpus for the built-in demo.

The demo must behave like real translation data, not like a puzzle a small
model solves perfectly (a saturated model makes every head look equally
unimportant).  So besides a grammar that makes every attention type work,
the language has what keeps real NMT well below 100 BLEU
(see ``demo_lexicon`` for the vocabulary):

* reordering: colour/state adjectives follow the noun, size/age adjectives
  precede it ("the big red car" -> "la grande voiture rouge");
* agreement: articles, adjectives, possessives and "de + le" contractions
  take the gender and number of a noun, which is itself one of several
  synonyms ("chaise"/"siège") of different genders; elision ("l' auto");
* long-range dependencies: the main verb agrees with a subject separated
  from it by a relative clause (whose "that" English may drop), whose
  pronoun (qui/que) depends on the clause's structure; negation wraps the
  verb ("ne ... pas", or colloquially "... pas"); the past tense splits into
  auxiliary + participle;
* context: ambiguous nouns ("plant", "bank") translate by the sentence's
  verb, which may come after them;
* a Zipfian long tail of invented nouns and of names (copied), most of them
  rare in training, some never seen;
* several acceptable translations: synonyms drawn at fixed rates, so one
  reference cannot be matched exactly even by a perfect model.

The ``shifted`` domain draws the same vocabulary with reversed core-word
frequencies, more tail words, longer sentences, coordinated subjects and more
clauses: a domain-shifted test set for the cross-domain study (paper
section 3.4).  ``majority=True`` always takes the most frequent translation:
the best a model can do against one sampled reference (the corpus's ceiling).
"""

import os
import random
from typing import Dict, List, Sequence, Tuple

from fairseq_headprune.corpora.demo_lexicon import (
    AMBIGUOUS_NOUNS,
    CORE_NOUNS,
    DETERMINERS,
    INTRANSITIVE_VERBS,
    NUMBERS,
    P_FRONTED_ADVERBIAL,
    PAST_ADVERBIALS,
    PERSON_NAMES,
    PLURAL_DETERMINERS,
    POST_ADJECTIVES,
    PRE_ADJECTIVES,
    PREPOSITIONS,
    PRESENT_ADVERBIALS,
    TAIL,
    TRANSITIVE_VERBS,
)
from fairseq_headprune.study.output.files import atomic_text_file

DOMAINS = ("news", "shifted")
_VOWELS = tuple("aeiouéèêâîô")
TAIL_EXPONENT = 0.5  # flatter than the core: many rare words, as in real text
_ELIDED = {"le": "l'", "la": "l'", "ma": "mon", "sa": "son"}


class _Phrase:
    """Parallel English and French token lists, with the head noun's features."""

    def __init__(self, english: List[str], french: List[str], plural: bool, gender: str):
        self.english = english
        self.french = french
        self.plural = plural
        self.gender = gender


def _elide(french: List[str]) -> List[str]:
    """French elision before a vowel: le/la -> l', ma/sa -> mon/son, ce -> cet."""
    out = list(french)
    for i in range(len(out) - 1):
        if out[i + 1].startswith(_VOWELS):
            if out[i] in _ELIDED:
                out[i] = _ELIDED[out[i]]
            elif out[i] == "ce":
                out[i] = "cet"
    return out


class SentenceGenerator:
    """Draws parallel sentences; ``domain`` sets word frequencies and lengths."""

    def __init__(self, seed: int, domain: str = "news", majority: bool = False):
        if domain not in DOMAINS:
            raise ValueError(f"unknown domain {domain!r} (expected one of {DOMAINS})")
        self.rng = random.Random(seed)
        # translation choices draw from their own stream, so that the majority
        # version of a corpus has exactly the same sentences
        self.variant_rng = random.Random(seed + 7919)
        self.majority = majority
        # the main verb agrees with the wrong number (acceptability corpus); the same draws either way
        self.flip_agreement = False
        self.domain = domain
        shifted = domain == "shifted"
        self.shifted = shifted
        self.p_relative = 0.35 if shifted else 0.2
        self.p_pp = 0.5 if shifted else 0.3
        self.p_coordination = 0.3 if shifted else 0.03
        self.p_negation = 0.35 if shifted else 0.2
        self.p_past = 0.4 if shifted else 0.3
        self.p_tail = 0.45 if shifted else 0.3
        self.p_name = 0.1
        self.p_ambiguous = 0.1
        self.p_adverbial = 0.3

    def _pick(self, items: Sequence, reverse: bool = True, exponent: float = 1.0):
        """Zipf-like frequencies by rank; the shifted domain reverses them."""
        weights = [1.0 / (rank + 1) ** exponent for rank in range(len(items))]
        if self.shifted and reverse:
            weights.reverse()
        return self.rng.choices(items, weights=weights, k=1)[0]

    def _variant(self, options: Sequence[tuple]) -> tuple:
        """One of several acceptable translations, at its rate (the first if ``majority``)."""
        if len(options) == 1:
            return options[0]
        choice = self.variant_rng.choices(options, weights=[option[-1] for option in options], k=1)[0]
        return options[0] if self.majority else choice

    def _noun(self) -> Tuple[str, str, tuple]:
        if self.rng.random() < self.p_tail:
            return self._pick(TAIL, reverse=False, exponent=TAIL_EXPONENT)
        return self._pick(CORE_NOUNS)

    def noun_phrase(self, allow_relative: bool = True, plural: bool = None, noun=None) -> _Phrase:
        rng = self.rng
        if noun is None:
            en_sg, en_pl, options = self._noun()
            fr_sg, fr_pl, gender, _ = self._variant(options)
        else:
            en_sg, en_pl, (fr_sg, fr_pl, gender) = noun
        if plural is None:
            plural = rng.random() < 0.35
        determiner = rng.choices(list(DETERMINERS) + ["number"], weights=[6, 3, 1, 1, 1, 1], k=1)[0]
        if determiner == "number":
            plural = True
            en_det, fr_det = self._pick(NUMBERS)
        else:
            fr_det = DETERMINERS[determiner][2 if plural else (0 if gender == "m" else 1)]
            en_det = PLURAL_DETERMINERS[determiner] if plural else determiner
        form = (2 if plural else 0) + (1 if gender == "f" else 0)
        english, french_pre, french_post = [], [], []
        if rng.random() < 0.3:
            english_adjective, options = self._pick(PRE_ADJECTIVES)
            english.append(english_adjective)
            french_pre.append(self._variant(options)[form])
        if rng.random() < 0.4:
            english_adjective, options = self._pick(POST_ADJECTIVES)
            english.append(english_adjective)
            french_post.append(self._variant(options)[form])
        english = [en_det] + english + [en_pl if plural else en_sg]
        french = _elide([fr_det] + french_pre + [fr_pl if plural else fr_sg]) + french_post
        phrase = _Phrase(english, french, plural, gender)
        if allow_relative and rng.random() < self.p_relative:
            self._add_relative_clause(phrase)
        return phrase

    def _verb_forms(self, verb: tuple, plural: bool, past: bool, negated: bool) -> Tuple[List[str], List[str]]:
        en_3sg, en_base, en_past, options = verb
        fr_3sg, fr_3pl, participle, _ = self._variant(options)
        colloquial = self.variant_rng.random() < 0.2 and not self.majority  # "... pas" without "ne"
        if past:
            auxiliary = "ont" if plural else "a"
            english = ["did", "not", en_base] if negated else [en_past]
            if negated:
                french = [auxiliary, "pas", participle] if colloquial else ["n'", auxiliary, "pas", participle]
            else:
                french = [auxiliary, participle]
        else:
            english = [en_base if plural else en_3sg]
            if negated:
                english = ["do" if plural else "does", "not", en_base]
            form = fr_3pl if plural else fr_3sg
            if negated:
                french = [form, "pas"] if colloquial else ["n'" if form.startswith(_VOWELS) else "ne", form, "pas"]
            else:
                french = [form]
        return english, french

    def _add_relative_clause(self, head: _Phrase) -> None:
        verb = self._pick(TRANSITIVE_VERBS)
        other = self.noun_phrase(allow_relative=False)
        if self.rng.random() < 0.5:
            # subject relative: "the cat that sees the dog" -> "qui voit"
            english_verb, french_verb = self._verb_forms(verb, head.plural, False, False)
            head.english += ["that"] + english_verb + other.english
            head.french += ["qui"] + french_verb + other.french
        else:
            # object relative: "the cat (that) the dog sees" -> "que ... voit"
            english_verb, french_verb = self._verb_forms(verb, other.plural, False, False)
            that = [] if self.rng.random() < 0.3 else ["that"]
            pronoun = "qu'" if other.french[0].startswith(_VOWELS) else "que"
            head.english += that + other.english + english_verb
            head.french += [pronoun] + other.french + french_verb

    def prepositional_phrase(self) -> Tuple[List[str], List[str]]:
        english_prep, options = self._pick(PREPOSITIONS)
        french_prep = self._variant(options)[0]
        phrase = self.noun_phrase(allow_relative=False)
        french = phrase.french
        if french_prep.endswith("de") and french[0] in ("le", "les"):
            # de + le -> du, de + les -> des
            contracted = "du" if french[0] == "le" else "des"
            french_tokens = french_prep.split()[:-1] + [contracted] + french[1:]
        else:
            french_tokens = french_prep.split() + french
        return english_prep.split() + phrase.english, french_tokens

    def subject(self) -> _Phrase:
        if self.rng.random() < self.p_name:
            name = self._pick(PERSON_NAMES, reverse=False, exponent=TAIL_EXPONENT)
            return _Phrase([name], [name], False, "m")
        first = self.noun_phrase()
        if self.rng.random() < self.p_coordination:
            second = self.noun_phrase(allow_relative=False)
            gender = "m" if "m" in (first.gender, second.gender) else "f"
            return _Phrase(first.english + ["and"] + second.english, first.french + ["et"] + second.french,
                           True, gender)
        return first

    def _object(self) -> _Phrase:
        if self.rng.random() < self.p_name:
            name = self._pick(PERSON_NAMES, reverse=False, exponent=TAIL_EXPONENT)
            return _Phrase([name], [name], False, "m")
        return self.noun_phrase()

    def _ambiguous(self, role: int) -> Tuple[tuple, tuple]:
        """An ambiguous noun in one sense and a verb that selects it (role 1: object, 2: subject)."""
        en_sg, en_pl, senses = self.rng.choice(AMBIGUOUS_NOUNS)
        sense = self.rng.choice(senses)
        return (en_sg, en_pl, sense[0]), self.rng.choice(sense[role])

    def sentence(self) -> Tuple[str, str]:
        rng = self.rng
        ambiguous = rng.random() < self.p_ambiguous
        role = rng.choice((1, 2)) if ambiguous else 0
        if role == 2:  # "the plant grows": the verb decides the noun
            noun, verb = self._ambiguous(2)
            subject = self.noun_phrase(noun=noun)
            transitive = False
        else:
            subject = self.subject()
            transitive = role == 1 or rng.random() < 0.7
            if role == 1:
                noun, verb = self._ambiguous(1)
            else:
                verb = self._pick(TRANSITIVE_VERBS if transitive else INTRANSITIVE_VERBS)
        negated = rng.random() < self.p_negation
        past = rng.random() < self.p_past
        english_verb, french_verb = self._verb_forms(verb, subject.plural != self.flip_agreement, past, negated)
        english = subject.english + english_verb
        french = subject.french + french_verb
        if transitive:
            obj = self.noun_phrase(noun=noun) if role == 1 else self._object()
            english += obj.english
            french += obj.french
        if rng.random() < self.p_pp:
            pp_english, pp_french = self.prepositional_phrase()
            english += pp_english
            french += pp_french
        if rng.random() < self.p_adverbial:
            english_adverbial, french_adverbial = self._pick(PAST_ADVERBIALS if past else PRESENT_ADVERBIALS)
            english += english_adverbial.split()
            fronted = self.variant_rng.random() < P_FRONTED_ADVERBIAL and not self.majority
            if fronted:
                french = french_adverbial.split() + [","] + french
            else:
                french += french_adverbial.split()
        return " ".join(english + ["."]), " ".join(french + ["."])


def generate_corpus(size: int, seed: int, domain: str = "news", majority: bool = False) -> List[Tuple[str, str]]:
    """``size`` distinct (english, french) pairs, the same for the same seed."""
    generator = SentenceGenerator(seed, domain, majority)
    pairs: Dict[str, str] = {}
    attempts = 0
    while len(pairs) < size:
        english, french = generator.sentence()
        pairs.setdefault(english, french)
        attempts += 1
        if attempts > 50 * size:
            raise RuntimeError(f"could not draw {size} distinct sentences")
    return list(pairs.items())


# split name -> (sentences, domain); the seeds differ per split
DEMO_SPLITS = {
    "train": (16000, "news"),
    "valid": (500, "news"),
    "test": (300, "news"),
    "test-shifted": (300, "shifted"),
}


def demo_splits(
    seed: int = 1, scale: float = 1.0, splits: Dict = None, majority: bool = False
) -> Dict[str, List[Tuple[str, str]]]:
    """The demo's sentence pairs per split (held-out splits never repeat a training source sentence)."""
    splits = splits or DEMO_SPLITS
    seen = set()
    pairs_by_split = {}
    for offset, (split, (size, domain)) in enumerate(splits.items()):
        size = max(1, int(round(size * scale)))
        pairs = generate_corpus(size + (0 if split == "train" else size), seed * 1000 + offset, domain, majority)
        pairs = [(en, fr) for en, fr in pairs if en not in seen][:size]
        seen.update(en for en, _ in pairs)
        pairs_by_split[split] = pairs
    return pairs_by_split


def write_columns(out_dir: str, split: str, columns: Dict[str, Sequence[str]]) -> None:
    for suffix, lines in columns.items():
        with atomic_text_file(os.path.join(out_dir, f"{split}.{suffix}")) as handle:
            handle.writelines(line + "\n" for line in lines)


def write_demo_corpus(
    out_dir: str, seed: int = 1, scale: float = 1.0, splits: Dict = None, majority: bool = False
) -> Dict[str, int]:
    """Write ``SPLIT.en`` / ``SPLIT.fr`` files; returns sentences per split.

    Held-out splits never repeat a training source sentence.  ``scale``
    shrinks every split (the tests use small corpora).  ``majority`` writes
    the most frequent translation of every word (the corpus's ceiling).
    """
    os.makedirs(out_dir, exist_ok=True)
    counts = {}
    for split, pairs in demo_splits(seed, scale, splits, majority).items():
        write_columns(out_dir, split, {"en": [en for en, _ in pairs], "fr": [fr for _, fr in pairs]})
        counts[split] = len(pairs)
    return counts


# labels of the acceptability corpus
ACCEPTABILITY_LABELS = ("acceptable", "unacceptable")


def generate_acceptability(size: int, seed: int, domain: str = "news") -> List[Tuple[str, str]]:
    """``size`` distinct (french, label) examples: does the main verb agree with its subject?

    Each sentence is drawn twice from the same random state, once as is and
    once with the main verb in the other number ("les chats que le chien
    voit dort"); one of the two is kept, half of the time the wrong one
    (only where the two differ). Deciding means finding the subject across
    relative clauses, coordinations and negation: a CoLA-like task
    (Michel et al. 2019, appendix B; Budhraja et al. 2020 prune BERT on GLUE)
    that a small model learns well but not perfectly.
    """
    generator = SentenceGenerator(seed, domain)
    choice = random.Random(seed + 104729)
    examples: Dict[str, str] = {}
    attempts = 0
    while len(examples) < size:
        states = generator.rng.getstate(), generator.variant_rng.getstate()
        _, french = generator.sentence()
        generator.rng.setstate(states[0])
        generator.variant_rng.setstate(states[1])
        generator.flip_agreement = True
        try:
            _, wrong = generator.sentence()
        finally:
            generator.flip_agreement = False
        unacceptable = wrong != french and choice.random() < 0.5
        text = wrong if unacceptable else french
        examples.setdefault(text, ACCEPTABILITY_LABELS[int(unacceptable)])
        attempts += 1
        if attempts > 50 * size:
            raise RuntimeError(f"could not draw {size} distinct sentences")
    return list(examples.items())


def write_acceptability_corpus(out_dir: str, seed: int = 1, scale: float = 1.0, splits: Dict = None) -> Dict[str, int]:
    """Write ``SPLIT.input0`` (a French sentence) and ``SPLIT.label``; returns examples per split.

    The splits and domains are the translation demo's (``test-shifted`` for
    the matched/mismatched study of section 3.4); held-out splits never
    repeat a training sentence.
    """
    os.makedirs(out_dir, exist_ok=True)
    seen = set()
    counts = {}
    for offset, (split, (size, domain)) in enumerate((splits or DEMO_SPLITS).items()):
        size = max(1, int(round(size * scale)))
        examples = generate_acceptability(size + (0 if split == "train" else size), seed * 1000 + 500 + offset, domain)
        examples = [(text, label) for text, label in examples if text not in seen][:size]
        seen.update(text for text, _ in examples)
        write_columns(out_dir, split, {"input0": [t for t, _ in examples], "label": [label for _, label in examples]})
        counts[split] = len(examples)
    return counts
