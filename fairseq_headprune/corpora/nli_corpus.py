"""A seeded synthetic 3-way inference corpus (MultiNLI-like) in the demo language.

Michel et al. (2019) run every study on BERT fine-tuned on MultiNLI, with a
matched and a mismatched (other genres) evaluation set (section 3.4).  This
corpus has the same shape at demo size: a premise drawn from the demo
language's English side (``demo_corpus.SentenceGenerator``'s vocabulary and
domains), a hypothesis built from the premise's structure, and the label
that structure implies:

* entailment: the main event restated with fewer modifiers, or the event of
  a relative clause stated on its own ("the cat that sees the dog sleeps" ->
  "the cat sees the dog");
* contradiction: either of those with its polarity flipped;
* neutral: the main event with a property the premise does not give, with
  another participant, or with the roles of a relative clause swapped or
  the main predicate given to the clause's other participant ("the cat that
  the dog sees sleeps" -> "the dog sleeps").

Deciding needs the premise's structure across relative clauses and
modifiers, and the long tail of rare nouns, so a small model learns it well
but not perfectly.  The ``shifted`` domain (reversed core frequencies, more
rare nouns, clauses and modifiers) gives the mismatched set.
"""

import os
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_headprune.corpora.demo_corpus import SentenceGenerator, write_columns
from fairseq_headprune.corpora.demo_lexicon import (
    DETERMINERS,
    INTRANSITIVE_VERBS,
    PAST_ADVERBIALS,
    PLURAL_DETERMINERS,
    POST_ADJECTIVES,
    PRE_ADJECTIVES,
    PREPOSITIONS,
    PRESENT_ADVERBIALS,
    TRANSITIVE_VERBS,
)

NLI_LABELS = ("entailment", "neutral", "contradiction")
# MultiNLI's evaluation sets are matched (the training genres) and mismatched (others)
NLI_SPLITS = {
    "train": (20000, "news"),
    "valid": (1000, "news"),
    "test": (1000, "news"),
    "test-mismatched": (1000, "shifted"),
}
ADJECTIVES = [english for english, _ in PRE_ADJECTIVES + POST_ADJECTIVES]


@dataclass
class NounPhrase:
    """A determiner, adjectives and a noun; ``relative`` is an event the phrase takes part in."""

    determiner: str
    adjectives: List[str]
    noun: Tuple[str, str]  # english singular, plural
    plural: bool
    relative: Optional["Event"] = None  # the clause "that ..." attached to this phrase
    relative_role: str = ""  # "subject" (the cat that sees ...) or "object" (the cat that the dog sees)

    def words(self, with_relative: bool = True) -> List[str]:
        determiner = PLURAL_DETERMINERS[self.determiner] if self.plural else self.determiner
        words = [determiner] + self.adjectives + [self.noun[1] if self.plural else self.noun[0]]
        if with_relative and self.relative is not None:
            event = self.relative
            if self.relative_role == "subject":
                words += ["that"] + _verb_words(event.verb, self.plural, False, False) + event.object.words(False)
            else:
                words += ["that"] + event.subject.words(False) + _verb_words(
                    event.verb, event.subject.plural, False, False)
        return words

    def bare(self) -> "NounPhrase":
        return replace(self, relative=None, relative_role="")


@dataclass
class Event:
    """Who does what (to whom): a clause, rendered in English by ``words``."""

    subject: NounPhrase
    verb: tuple  # english 3sg, base, past, translations
    object: Optional[NounPhrase] = None
    negated: bool = False
    past: bool = False
    extras: List[str] = field(default_factory=list)  # a prepositional phrase and an adverbial

    def words(self, with_relatives: bool = True) -> List[str]:
        words = self.subject.words(with_relatives) + _verb_words(
            self.verb, self.subject.plural, self.past, self.negated)
        if self.object is not None:
            words += self.object.words(with_relatives)
        return words + self.extras

    def sentence(self, with_relatives: bool = True) -> str:
        return " ".join(self.words(with_relatives) + ["."])


def _verb_words(verb: tuple, plural: bool, past: bool, negated: bool) -> List[str]:
    third_singular, base, past_form = verb[:3]
    if past:
        return ["did", "not", base] if negated else [past_form]
    if negated:
        return ["do" if plural else "does", "not", base]
    return [base if plural else third_singular]


class InferenceGenerator:
    """Draws (premise, hypothesis, label) triples; ``domain`` as ``SentenceGenerator``'s."""

    def __init__(self, seed: int, domain: str = "news"):
        self.words = SentenceGenerator(seed, domain)  # the demo language's frequencies and lengths
        self.rng = self.words.rng

    def noun_phrase(self, allow_relative: bool = True, avoid: Sequence[str] = ()) -> NounPhrase:
        rng = self.rng
        for _ in range(100):
            english_singular, english_plural, _ = self.words._noun()
            if english_singular not in avoid:
                break
        plural = rng.random() < 0.35
        determiner = rng.choices(list(DETERMINERS), weights=[6, 3, 1, 1, 1], k=1)[0]
        adjectives = []
        if rng.random() < 0.35:
            adjectives.append(self.words._pick(PRE_ADJECTIVES)[0])
        if rng.random() < 0.45:
            adjectives.append(self.words._pick(POST_ADJECTIVES)[0])
        phrase = NounPhrase(determiner, adjectives, (english_singular, english_plural), plural)
        if allow_relative and rng.random() < self.words.p_relative * 2:
            other = self.noun_phrase(allow_relative=False, avoid=(english_singular,))
            verb = self.words._pick(TRANSITIVE_VERBS)
            if rng.random() < 0.5:
                phrase.relative, phrase.relative_role = Event(phrase.bare(), verb, other), "subject"
            else:
                phrase.relative, phrase.relative_role = Event(other, verb, phrase.bare()), "object"
        return phrase

    def premise(self) -> Event:
        rng = self.rng
        subject = self.noun_phrase()
        transitive = rng.random() < 0.6
        verb = self.words._pick(TRANSITIVE_VERBS if transitive else INTRANSITIVE_VERBS)
        avoid = [subject.noun[0]] + ([subject.relative.subject.noun[0], subject.relative.object.noun[0]]
                                     if subject.relative else [])
        obj = self.noun_phrase(allow_relative=False, avoid=avoid) if transitive else None
        event = Event(subject, verb, obj, negated=rng.random() < self.words.p_negation,
                      past=rng.random() < self.words.p_past)
        if rng.random() < self.words.p_pp:
            preposition = self.words._pick(PREPOSITIONS)[0]
            event.extras += preposition.split() + self.noun_phrase(allow_relative=False).words()
        if rng.random() < self.words.p_adverbial:
            event.extras += self.words._pick(PAST_ADVERBIALS if event.past else PRESENT_ADVERBIALS)[0].split()
        return event

    def _fewer_modifiers(self, phrase: NounPhrase) -> NounPhrase:
        kept = [adjective for adjective in phrase.adjectives if self.rng.random() < 0.5]
        return replace(phrase.bare(), adjectives=kept)

    def _restated(self, premise: Event) -> Event:
        """The main event, each phrase keeping some of its adjectives, no clause, no extras."""
        obj = self._fewer_modifiers(premise.object) if premise.object is not None else None
        return Event(self._fewer_modifiers(premise.subject), premise.verb, obj, premise.negated, premise.past)

    def hypothesis(self, premise: Event, label: str) -> Optional[Event]:
        """A hypothesis with ``label`` for ``premise``, or None where this draw cannot make one."""
        rng = self.rng
        relative = premise.subject.relative
        if label == "entailment" or label == "contradiction":
            if relative is not None and rng.random() < 0.4:
                hypothesis = Event(self._fewer_modifiers(relative.subject), relative.verb,
                                   self._fewer_modifiers(relative.object))
            else:
                hypothesis = self._restated(premise)
            if label == "contradiction":
                hypothesis.negated = not hypothesis.negated
            return hypothesis
        # neutral: something the premise does not say, with either polarity
        kind = rng.choice(("property", "participant", "swap"))
        if kind == "property":
            hypothesis = self._restated(premise)
            phrases = [hypothesis.subject] + ([hypothesis.object] if hypothesis.object else [])
            phrase = rng.choice(phrases)
            given = (premise.subject if phrase is hypothesis.subject else premise.object).adjectives
            new = [adjective for adjective in ADJECTIVES if adjective not in given]
            phrase.adjectives = phrase.adjectives + [rng.choice(new)]
        elif kind == "participant":
            hypothesis = self._restated(premise)
            mentioned = {premise.subject.noun[0]} | ({premise.object.noun[0]} if premise.object else set())
            if relative is not None:
                mentioned |= {relative.subject.noun[0], relative.object.noun[0]}
            replaced = self.noun_phrase(allow_relative=False, avoid=tuple(mentioned))
            if hypothesis.object is not None and rng.random() < 0.5:
                hypothesis.object = replaced
            else:
                hypothesis.subject = replaced
        else:
            if relative is None:
                return None
            if rng.random() < 0.5:  # the clause's roles swapped
                hypothesis = Event(self._fewer_modifiers(relative.object), relative.verb,
                                   self._fewer_modifiers(relative.subject))
            else:  # the main predicate said of the clause's other participant
                other = relative.object if premise.subject.relative_role == "subject" else relative.subject
                hypothesis = replace(self._restated(premise), subject=self._fewer_modifiers(other))
        hypothesis.negated = rng.random() < 0.5
        return hypothesis


def generate_inference(size: int, seed: int, domain: str = "news") -> List[Tuple[str, str, str]]:
    """``size`` distinct (premise, hypothesis, label) triples, labels in equal shares, the same for a seed."""
    generator = InferenceGenerator(seed, domain)
    examples: Dict[Tuple[str, str], str] = {}
    attempts = 0
    while len(examples) < size:
        attempts += 1
        if attempts > 50 * size:
            raise RuntimeError(f"could not draw {size} distinct examples")
        label = NLI_LABELS[len(examples) % 3]  # in turn: equal shares
        premise = generator.premise()
        hypothesis = generator.hypothesis(premise, label)
        if hypothesis is None:
            continue
        key = (premise.sentence(), hypothesis.sentence())
        if key[0] != key[1]:
            examples.setdefault(key, label)
    return [(premise, hypothesis, label) for (premise, hypothesis), label in examples.items()]


def write_inference_corpus(out_dir: str, seed: int = 1, scale: float = 1.0, splits: Dict = None) -> Dict[str, int]:
    """Write ``SPLIT.input0`` (premise), ``SPLIT.input1`` (hypothesis), ``SPLIT.label``; examples per split.

    ``test`` is the matched set, ``test-mismatched`` the domain-shifted one;
    held-out splits never repeat a training premise.
    """
    os.makedirs(out_dir, exist_ok=True)
    seen = set()
    counts = {}
    for offset, (split, (size, domain)) in enumerate((splits or NLI_SPLITS).items()):
        size = max(3, int(round(size * scale)))
        examples = generate_inference(size + (0 if split == "train" else size), seed * 1000 + 700 + offset, domain)
        examples = [example for example in examples if example[0] not in seen][:size]
        seen.update(premise for premise, _, _ in examples)
        write_columns(out_dir, split, {"input0": [p for p, _, _ in examples], "input1": [h for _, h, _ in examples],
                                        "label": [label for _, _, label in examples]})
        counts[split] = len(examples)
    return counts


# masked-LM pretraining text: split -> (sentences, seed offset)
PRETRAINING_SPLITS = {"train": (40000, 0), "valid": (1000, 1)}


def write_pretraining_text(out_dir: str, seed: int = 1, scale: float = 1.0) -> Dict[str, int]:
    """Write ``pretrain.SPLIT.txt`` for each of ``PRETRAINING_SPLITS``; returns sentences per split."""
    counts = {}
    for split, (size, offset) in PRETRAINING_SPLITS.items():
        sentences = pretraining_text(seed + offset, scale, size)
        write_columns(out_dir, f"pretrain.{split}", {"txt": sentences})
        counts[split] = len(sentences)
    return counts


def pretraining_text(seed: int = 1, scale: float = 1.0, size: int = 40000) -> List[str]:
    """English sentences of the demo language for masked-LM pretraining, from their own seeds.

    One in five is of the shifted domain: pretraining text covers more
    genres than the fine-tuning data, as RoBERTa's does MultiNLI's.
    """
    count = max(10, int(round(size * scale)))
    news = SentenceGenerator(seed * 1000 + 900, "news")
    shifted = SentenceGenerator(seed * 1000 + 901, "shifted")
    return [(shifted if index % 5 == 4 else news).sentence()[0] for index in range(count)]
