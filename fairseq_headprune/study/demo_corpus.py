"""A seeded synthetic English -> French-like corpus for the built-in demo.

The grammar is small but makes every attention type do work:

* reordering: colour/state adjectives follow the noun, size/age adjectives
  precede it ("the big red car" -> "la grande voiture rouge");
* agreement: articles, adjectives, possessives ("his" -> son/sa/ses) and
  "de + le" contractions take the gender and number of a noun that may come
  later in the target sentence;
* long-range dependencies: the main verb agrees with a subject separated
  from it by a relative clause, whose pronoun (qui/que) depends on whether
  the head noun is the clause's subject or object; negation wraps the verb
  (ne ... pas); the past tense splits into auxiliary + participle.

The ``shifted`` domain draws the same vocabulary with reversed word
frequencies, longer sentences, coordinated subjects and more clauses: a
domain-shifted test set for the cross-domain study (paper section 3.4).
"""

import os
import random
from typing import Dict, List, Sequence, Tuple

from .files import atomic_text_file

# english singular, english plural, french singular, french plural, gender
NOUNS = [
    ("cat", "cats", "chat", "chats", "m"),
    ("dog", "dogs", "chien", "chiens", "m"),
    ("house", "houses", "maison", "maisons", "f"),
    ("car", "cars", "voiture", "voitures", "f"),
    ("tree", "trees", "arbre", "arbres", "m"),
    ("flower", "flowers", "fleur", "fleurs", "f"),
    ("bird", "birds", "oiseau", "oiseaux", "m"),
    ("table", "tables", "table", "tables", "f"),
    ("book", "books", "livre", "livres", "m"),
    ("city", "cities", "ville", "villes", "f"),
    ("river", "rivers", "rivière", "rivières", "f"),
    ("horse", "horses", "cheval", "chevaux", "m"),
    ("girl", "girls", "fille", "filles", "f"),
    ("boy", "boys", "garçon", "garçons", "m"),
    ("woman", "women", "femme", "femmes", "f"),
    ("man", "men", "homme", "hommes", "m"),
    ("teacher", "teachers", "professeur", "professeurs", "m"),
    ("apple", "apples", "pomme", "pommes", "f"),
    ("door", "doors", "porte", "portes", "f"),
    ("window", "windows", "fenêtre", "fenêtres", "f"),
    ("chair", "chairs", "chaise", "chaises", "f"),
    ("garden", "gardens", "jardin", "jardins", "m"),
    ("street", "streets", "rue", "rues", "f"),
    ("friend", "friends", "ami", "amis", "m"),
    ("letter", "letters", "lettre", "lettres", "f"),
    ("boat", "boats", "bateau", "bateaux", "m"),
    ("mountain", "mountains", "montagne", "montagnes", "f"),
    ("student", "students", "étudiant", "étudiants", "m"),
    ("king", "kings", "roi", "rois", "m"),
    ("queen", "queens", "reine", "reines", "f"),
]

# english, french m.sg, f.sg, m.pl, f.pl
PRE_ADJECTIVES = [
    ("big", "grand", "grande", "grands", "grandes"),
    ("small", "petit", "petite", "petits", "petites"),
    ("old", "vieux", "vieille", "vieux", "vieilles"),
    ("new", "nouveau", "nouvelle", "nouveaux", "nouvelles"),
    ("good", "bon", "bonne", "bons", "bonnes"),
    ("beautiful", "beau", "belle", "beaux", "belles"),
]
POST_ADJECTIVES = [
    ("red", "rouge", "rouge", "rouges", "rouges"),
    ("black", "noir", "noire", "noirs", "noires"),
    ("green", "vert", "verte", "verts", "vertes"),
    ("white", "blanc", "blanche", "blancs", "blanches"),
    ("blue", "bleu", "bleue", "bleus", "bleues"),
    ("happy", "heureux", "heureuse", "heureux", "heureuses"),
    ("sad", "triste", "triste", "tristes", "tristes"),
    ("strong", "fort", "forte", "forts", "fortes"),
]

# english 3sg, english base, english past, french 3sg, french 3pl, participle
TRANSITIVE_VERBS = [
    ("sees", "see", "saw", "voit", "voient", "vu"),
    ("likes", "like", "liked", "aime", "aiment", "aimé"),
    ("eats", "eat", "ate", "mange", "mangent", "mangé"),
    ("finds", "find", "found", "trouve", "trouvent", "trouvé"),
    ("takes", "take", "took", "prend", "prennent", "pris"),
    ("watches", "watch", "watched", "regarde", "regardent", "regardé"),
    ("follows", "follow", "followed", "suit", "suivent", "suivi"),
    ("calls", "call", "called", "appelle", "appellent", "appelé"),
    ("opens", "open", "opened", "ouvre", "ouvrent", "ouvert"),
    ("helps", "help", "helped", "aide", "aident", "aidé"),
]
INTRANSITIVE_VERBS = [
    ("sleeps", "sleep", "slept", "dort", "dorment", "dormi"),
    ("runs", "run", "ran", "court", "courent", "couru"),
    ("sings", "sing", "sang", "chante", "chantent", "chanté"),
    ("waits", "wait", "waited", "attend", "attendent", "attendu"),
    ("works", "work", "worked", "travaille", "travaillent", "travaillé"),
]

# english, french; the french preposition "de" contracts with le/les
PREPOSITIONS = [
    ("in", "dans"),
    ("with", "avec"),
    ("near", "près de"),
    ("behind", "derrière"),
    ("under", "sous"),
    ("far from", "loin de"),
]

# english determiner -> french (m.sg, f.sg, plural)
DETERMINERS = {
    "the": ("le", "la", "les"),
    "a": ("un", "une", "des"),
    "this": ("ce", "cette", "ces"),
    "my": ("mon", "ma", "mes"),
    "his": ("son", "sa", "ses"),
}
PLURAL_DETERMINERS = {"the": "the", "a": "some", "this": "these", "my": "my", "his": "his"}

DOMAINS = ("news", "shifted")


class _Phrase:
    """Parallel English and French token lists, with the head noun's features."""

    def __init__(self, english: List[str], french: List[str], plural: bool, gender: str):
        self.english = english
        self.french = french
        self.plural = plural
        self.gender = gender


class SentenceGenerator:
    """Draws parallel sentences; ``domain`` sets word frequencies and lengths."""

    def __init__(self, seed: int, domain: str = "news"):
        if domain not in DOMAINS:
            raise ValueError(f"unknown domain {domain!r} (expected one of {DOMAINS})")
        self.rng = random.Random(seed)
        self.domain = domain
        shifted = domain == "shifted"
        # Zipf-like frequencies; the shifted domain reverses them.
        self.p_relative = 0.35 if shifted else 0.2
        self.p_pp = 0.5 if shifted else 0.3
        self.p_coordination = 0.3 if shifted else 0.03
        self.p_negation = 0.35 if shifted else 0.2
        self.p_past = 0.4 if shifted else 0.3
        self.shifted = shifted

    def _pick(self, items: Sequence):
        weights = [1.0 / (rank + 1) for rank in range(len(items))]
        if self.shifted:
            weights.reverse()
        return self.rng.choices(items, weights=weights, k=1)[0]

    def noun_phrase(self, allow_relative: bool = True, plural: bool = None) -> _Phrase:
        rng = self.rng
        en_sg, en_pl, fr_sg, fr_pl, gender = self._pick(NOUNS)
        if plural is None:
            plural = rng.random() < 0.35
        determiner = rng.choices(list(DETERMINERS), weights=[6, 3, 1, 1, 1], k=1)[0]
        fr_det = DETERMINERS[determiner][2 if plural else (0 if gender == "m" else 1)]
        en_det = PLURAL_DETERMINERS[determiner] if plural else determiner
        form = (2 if plural else 0) + (1 if gender == "f" else 0)
        english, french_pre, french_post = [], [], []
        if rng.random() < 0.3:
            adjective = self._pick(PRE_ADJECTIVES)
            english.append(adjective[0])
            french_pre.append(adjective[1 + form])
        if rng.random() < 0.4:
            adjective = self._pick(POST_ADJECTIVES)
            english.append(adjective[0])
            french_post.append(adjective[1 + form])
        english = [en_det] + english + [en_pl if plural else en_sg]
        french = [fr_det] + french_pre + [fr_pl if plural else fr_sg] + french_post
        phrase = _Phrase(english, french, plural, gender)
        if allow_relative and rng.random() < self.p_relative:
            self._add_relative_clause(phrase)
        return phrase

    def _add_relative_clause(self, head: _Phrase) -> None:
        verb = self._pick(TRANSITIVE_VERBS)
        other = self.noun_phrase(allow_relative=False)
        if self.rng.random() < 0.5:
            # subject relative: "the cat that sees the dog" -> "qui voit"
            english_verb = verb[1] if head.plural else verb[0]
            french_verb = verb[4] if head.plural else verb[3]
            head.english += ["that", english_verb] + other.english
            head.french += ["qui", french_verb] + other.french
        else:
            # object relative: "the cat that the dog sees" -> "que ... voit"
            english_verb = verb[1] if other.plural else verb[0]
            french_verb = verb[4] if other.plural else verb[3]
            head.english += ["that"] + other.english + [english_verb]
            head.french += ["que"] + other.french + [french_verb]

    def prepositional_phrase(self) -> Tuple[List[str], List[str]]:
        english_prep, french_prep = self._pick(PREPOSITIONS)
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
        first = self.noun_phrase()
        if self.rng.random() < self.p_coordination:
            second = self.noun_phrase(allow_relative=False)
            gender = "m" if "m" in (first.gender, second.gender) else "f"
            return _Phrase(
                first.english + ["and"] + second.english,
                first.french + ["et"] + second.french,
                True,
                gender,
            )
        return first

    def sentence(self) -> Tuple[str, str]:
        rng = self.rng
        subject = self.subject()
        transitive = rng.random() < 0.7
        verb = self._pick(TRANSITIVE_VERBS if transitive else INTRANSITIVE_VERBS)
        negated = rng.random() < self.p_negation
        past = rng.random() < self.p_past
        plural = subject.plural
        if past:
            auxiliary = "ont" if plural else "a"
            english_verb = (["did", "not", verb[1]] if negated else [verb[2]])
            french_verb = (["n'", auxiliary, "pas", verb[5]] if negated else [auxiliary, verb[5]])
        else:
            english_verb = [verb[1] if plural else verb[0]]
            if negated:
                english_verb = ["do" if plural else "does", "not", verb[1]]
            french_form = verb[4] if plural else verb[3]
            french_verb = ["ne", french_form, "pas"] if negated else [french_form]
        english = subject.english + english_verb
        french = subject.french + french_verb
        if transitive:
            obj = self.noun_phrase()
            english += obj.english
            french += obj.french
        if rng.random() < self.p_pp:
            pp_english, pp_french = self.prepositional_phrase()
            english += pp_english
            french += pp_french
        return " ".join(english + ["."]), " ".join(french + ["."])


def generate_corpus(size: int, seed: int, domain: str = "news") -> List[Tuple[str, str]]:
    """``size`` distinct (english, french) pairs, the same for the same seed."""
    generator = SentenceGenerator(seed, domain)
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
    "train": (20000, "news"),
    "valid": (500, "news"),
    "test": (1000, "news"),
    "test-shifted": (1000, "shifted"),
}


def write_demo_corpus(
    out_dir: str, seed: int = 1, scale: float = 1.0, splits: Dict = None
) -> Dict[str, int]:
    """Write ``SPLIT.en`` / ``SPLIT.fr`` files; returns sentences per split.

    Held-out splits never repeat a training source sentence.  ``scale``
    shrinks every split (the tests use small corpora).
    """
    os.makedirs(out_dir, exist_ok=True)
    splits = splits or DEMO_SPLITS
    seen = set()
    counts = {}
    for offset, (split, (size, domain)) in enumerate(splits.items()):
        size = max(1, int(round(size * scale)))
        pairs = generate_corpus(size + (0 if split == "train" else size), seed * 1000 + offset, domain)
        pairs = [(en, fr) for en, fr in pairs if en not in seen][:size]
        seen.update(en for en, _ in pairs)
        for suffix, column in (("en", 0), ("fr", 1)):
            path = os.path.join(out_dir, f"{split}.{suffix}")
            with atomic_text_file(path) as handle:
                handle.writelines(pair[column] + "\n" for pair in pairs)
        counts[split] = len(pairs)
    return counts
