"""The demo language's vocabulary: a hand-made core and a long seeded tail.

Real translation data is not saturated because of its vocabulary: a few words
are frequent, most are rare (Zipf), many words have several acceptable
translations, and some English words translate differently by context.  The
demo language has all three:

* core words with real French translations, some with synonyms drawn at a
  fixed rate (``car`` -> ``voiture`` or ``auto``; ``chair`` -> ``chaise`` or
  ``siège``, of another gender, so agreement follows the chosen word);
* ambiguous nouns whose translation is set by the verb of the sentence
  (``the plant grows`` -> ``la plante``, ``the plant closes`` -> ``l'usine``);
* a long tail of invented nouns and names, drawn from a fixed seed so the
  lexicon is a property of the language, not of the corpus seed: most of
  them are seen a few times in training, some never.

Every translation option is ``(french forms..., weight)``; the first option is
the most frequent one.
"""

import random
from typing import List, Tuple

LEXICON_SEED = 2019  # the tail is part of the language: independent of the corpus seed
TAIL_NOUNS = 1200
NAMES = 250
TAIL_SYNONYMS = 0.4  # share of the invented nouns with two translations

# english singular, english plural, options: (french singular, french plural, gender, weight)
CORE_NOUNS = [
    ("cat", "cats", [("chat", "chats", "m", 0.8), ("matou", "matous", "m", 0.2)]),
    ("dog", "dogs", [("chien", "chiens", "m", 1.0)]),
    ("house", "houses", [("maison", "maisons", "f", 0.55), ("demeure", "demeures", "f", 0.45)]),
    ("car", "cars", [("voiture", "voitures", "f", 0.55), ("auto", "autos", "f", 0.45)]),
    ("tree", "trees", [("arbre", "arbres", "m", 1.0)]),
    ("flower", "flowers", [("fleur", "fleurs", "f", 1.0)]),
    ("bird", "birds", [("oiseau", "oiseaux", "m", 1.0)]),
    ("table", "tables", [("table", "tables", "f", 1.0)]),
    ("book", "books", [("livre", "livres", "m", 0.55), ("bouquin", "bouquins", "m", 0.45)]),
    ("city", "cities", [("ville", "villes", "f", 0.55), ("cité", "cités", "f", 0.45)]),
    ("river", "rivers", [("rivière", "rivières", "f", 0.6), ("fleuve", "fleuves", "m", 0.4)]),
    ("horse", "horses", [("cheval", "chevaux", "m", 0.55), ("monture", "montures", "f", 0.45)]),
    ("girl", "girls", [("fille", "filles", "f", 1.0)]),
    ("boy", "boys", [("garçon", "garçons", "m", 0.55), ("gamin", "gamins", "m", 0.45)]),
    ("woman", "women", [("femme", "femmes", "f", 0.55), ("dame", "dames", "f", 0.45)]),
    ("man", "men", [("homme", "hommes", "m", 1.0)]),
    ("teacher", "teachers", [("professeur", "professeurs", "m", 0.6), ("enseignant", "enseignants", "m", 0.4)]),
    ("apple", "apples", [("pomme", "pommes", "f", 1.0)]),
    ("door", "doors", [("porte", "portes", "f", 1.0)]),
    ("window", "windows", [("fenêtre", "fenêtres", "f", 1.0)]),
    ("chair", "chairs", [("chaise", "chaises", "f", 0.55), ("siège", "sièges", "m", 0.45)]),
    ("garden", "gardens", [("jardin", "jardins", "m", 0.55), ("potager", "potagers", "m", 0.45)]),
    ("street", "streets", [("rue", "rues", "f", 0.55), ("avenue", "avenues", "f", 0.45)]),
    ("friend", "friends", [("ami", "amis", "m", 0.6), ("copain", "copains", "m", 0.4)]),
    ("letter", "letters", [("lettre", "lettres", "f", 0.55), ("courrier", "courriers", "m", 0.45)]),
    ("boat", "boats", [("bateau", "bateaux", "m", 0.6), ("barque", "barques", "f", 0.4)]),
    ("mountain", "mountains", [("montagne", "montagnes", "f", 0.55), ("mont", "monts", "m", 0.45)]),
    ("student", "students", [("étudiant", "étudiants", "m", 0.55), ("élève", "élèves", "m", 0.45)]),
    ("king", "kings", [("roi", "rois", "m", 1.0)]),
    ("queen", "queens", [("reine", "reines", "f", 1.0)]),
]

# english, options: (french m.sg, f.sg, m.pl, f.pl, weight)
PRE_ADJECTIVES = [
    ("big", [("grand", "grande", "grands", "grandes", 0.55), ("gros", "grosse", "gros", "grosses", 0.45)]),
    ("small", [("petit", "petite", "petits", "petites", 1.0)]),
    ("old", [("vieux", "vieille", "vieux", "vieilles", 1.0)]),
    ("new", [("nouveau", "nouvelle", "nouveaux", "nouvelles", 1.0)]),
    ("good", [("bon", "bonne", "bons", "bonnes", 1.0)]),
    ("beautiful", [("beau", "belle", "beaux", "belles", 0.6), ("joli", "jolie", "jolis", "jolies", 0.4)]),
]
POST_ADJECTIVES = [
    ("red", [("rouge", "rouge", "rouges", "rouges", 1.0)]),
    ("black", [("noir", "noire", "noirs", "noires", 1.0)]),
    ("green", [("vert", "verte", "verts", "vertes", 1.0)]),
    ("white", [("blanc", "blanche", "blancs", "blanches", 1.0)]),
    ("blue", [("bleu", "bleue", "bleus", "bleues", 1.0)]),
    ("happy", [("heureux", "heureuse", "heureux", "heureuses", 0.55),
               ("content", "contente", "contents", "contentes", 0.45)]),
    ("sad", [("triste", "triste", "tristes", "tristes", 0.55),
             ("malheureux", "malheureuse", "malheureux", "malheureuses", 0.45)]),
    ("strong", [("fort", "forte", "forts", "fortes", 0.55), ("robuste", "robuste", "robustes", "robustes", 0.45)]),
]

# english 3sg, base, past; options: (french 3sg, 3pl, participle, weight)
TRANSITIVE_VERBS = [
    ("sees", "see", "saw", [("voit", "voient", "vu", 0.55), ("aperçoit", "aperçoivent", "aperçu", 0.45)]),
    ("likes", "like", "liked", [("aime", "aiment", "aimé", 0.6), ("apprécie", "apprécient", "apprécié", 0.4)]),
    ("eats", "eat", "ate", [("mange", "mangent", "mangé", 0.55), ("dévore", "dévorent", "dévoré", 0.45)]),
    ("finds", "find", "found", [("trouve", "trouvent", "trouvé", 0.55), ("découvre", "découvrent", "découvert", 0.45)]),
    ("takes", "take", "took", [("prend", "prennent", "pris", 0.55), ("saisit", "saisissent", "saisi", 0.45)]),
    ("watches", "watch", "watched", [("regarde", "regardent", "regardé", 0.6),
                                     ("observe", "observent", "observé", 0.4)]),
    ("follows", "follow", "followed", [("suit", "suivent", "suivi", 1.0)]),
    ("calls", "call", "called", [("appelle", "appellent", "appelé", 1.0)]),
    ("opens", "open", "opened", [("ouvre", "ouvrent", "ouvert", 1.0)]),
    ("helps", "help", "helped", [("aide", "aident", "aidé", 1.0)]),
]
INTRANSITIVE_VERBS = [
    ("sleeps", "sleep", "slept", [("dort", "dorment", "dormi", 0.55), ("sommeille", "sommeillent", "sommeillé", 0.45)]),
    ("runs", "run", "ran", [("court", "courent", "couru", 1.0)]),
    ("sings", "sing", "sang", [("chante", "chantent", "chanté", 1.0)]),
    ("waits", "wait", "waited", [("attend", "attendent", "attendu", 1.0)]),
    ("works", "work", "worked", [("travaille", "travaillent", "travaillé", 0.55), ("bosse", "bossent", "bossé", 0.45)]),
]

# english, options: (french, weight); the french "de" contracts with le/les
PREPOSITIONS = [
    ("in", [("dans", 1.0)]),
    ("with", [("avec", 1.0)]),
    ("near", [("près de", 0.6), ("à côté de", 0.4)]),
    ("behind", [("derrière", 1.0)]),
    ("under", [("sous", 1.0)]),
    ("far from", [("loin de", 1.0)]),
]

# ambiguous english nouns: english sg, pl, senses; a sense is the french noun
# (sg, pl, gender) with the transitive verbs (it is their object) and the
# intransitive verbs (it is their subject) that select it
AMBIGUOUS_NOUNS = [
    ("plant", "plants", [
        (("plante", "plantes", "f"),
         [("waters", "water", "watered", [("arrose", "arrosent", "arrosé", 1.0)])],
         [("grows", "grow", "grew", [("pousse", "poussent", "poussé", 1.0)])]),
        (("usine", "usines", "f"),
         [("builds", "build", "built", [("construit", "construisent", "construit", 1.0)])],
         [("closes", "close", "closed", [("ferme", "ferment", "fermé", 1.0)])]),
    ]),
    ("bank", "banks", [
        (("banque", "banques", "f"),
         [("robs", "rob", "robbed", [("cambriole", "cambriolent", "cambriolé", 1.0)])],
         [("lends", "lend", "lent", [("prête", "prêtent", "prêté", 1.0)])]),
        (("rive", "rives", "f"),
         [("crosses", "cross", "crossed", [("traverse", "traversent", "traversé", 1.0)])],
         [("floods", "flood", "flooded", [("déborde", "débordent", "débordé", 1.0)])]),
    ]),
    ("court", "courts", [
        (("tribunal", "tribunaux", "m"),
         [("sues", "sue", "sued", [("poursuit", "poursuivent", "poursuivi", 1.0)])],
         [("decides", "decide", "decided", [("décide", "décident", "décidé", 1.0)])]),
        (("cour", "cours", "f"),
         [("sweeps", "sweep", "swept", [("balaie", "balaient", "balayé", 1.0)])],
         [("echoes", "echo", "echoed", [("résonne", "résonnent", "résonné", 1.0)])]),
    ]),
    ("bat", "bats", [
        (("chauve-souris", "chauves-souris", "f"),
         [("feeds", "feed", "fed", [("nourrit", "nourrissent", "nourri", 1.0)])],
         [("flies", "fly", "flew", [("vole", "volent", "volé", 1.0)])]),
        (("batte", "battes", "f"),
         [("swings", "swing", "swung", [("balance", "balancent", "balancé", 1.0)])],
         [("cracks", "crack", "cracked", [("craque", "craquent", "craqué", 1.0)])]),
    ]),
]

# sentence adverbials by tense: english (at the end), french (at the end, or
# fronted with a comma: both are correct french, and one reference has one)
PRESENT_ADVERBIALS = [("today", "aujourd'hui"), ("every day", "chaque jour"), ("at night", "la nuit"),
                      ("in the morning", "le matin"), ("now", "maintenant")]
PAST_ADVERBIALS = [("yesterday", "hier"), ("last night", "hier soir"), ("last year", "l'an dernier"),
                   ("in the morning", "le matin")]
P_FRONTED_ADVERBIAL = 0.5

# english determiner -> french (m.sg, f.sg, plural)
DETERMINERS = {
    "the": ("le", "la", "les"),
    "a": ("un", "une", "des"),
    "this": ("ce", "cette", "ces"),
    "my": ("mon", "ma", "mes"),
    "his": ("son", "sa", "ses"),
}
PLURAL_DETERMINERS = {"the": "the", "a": "some", "this": "these", "my": "my", "his": "his"}
NUMBERS = [("two", "deux"), ("three", "trois"), ("four", "quatre"), ("five", "cinq")]

_EN_ONSETS = "b bl br c cl cr d dr f fl fr g gl gr h j k l m n p pl pr r s sc sk sl sn sp st t tr v w z".split()
_EN_VOWELS = "a e i o u ea oo ai".split()
_EN_CODAS = ["", "n", "m", "t", "ck", "ll", "sh", "rd", "nt", "st", "p", "g", "x"]
_FR_ONSETS = "b br c ch cl d f fl g gr j l m n p pl pr qu r s t tr v".split()
_FR_VOWELS = "a e i o ou é è au eu oi".split()
_FR_FEMININE = ["ette", "ine", "ure", "ade", "elle", "ie", "ance", "ole"]
_FR_MASCULINE = ["on", "eau", "ier", "et", "in", "age", "ot", "eur"]


def _english_word(rng: random.Random) -> str:
    syllables = rng.choice((1, 2, 2, 3))
    return "".join(rng.choice(_EN_ONSETS) + rng.choice(_EN_VOWELS) for _ in range(syllables)) + rng.choice(_EN_CODAS)


def _english_plural(word: str) -> str:
    return word + ("es" if word.endswith(("sh", "s", "x")) else "s")


def _french_word(rng: random.Random) -> Tuple[str, str, str]:
    """A french-looking noun, its plural and gender (the ending predicts the gender, with exceptions)."""
    gender = rng.choice("mf")
    ending_gender = gender if rng.random() < 0.85 else ("f" if gender == "m" else "m")
    ending = rng.choice(_FR_FEMININE if ending_gender == "f" else _FR_MASCULINE)
    stem = "".join(rng.choice(_FR_ONSETS) + rng.choice(_FR_VOWELS) for _ in range(rng.choice((1, 2, 2))))
    singular = stem + rng.choice(_FR_ONSETS) + ending
    plural = singular + ("x" if singular.endswith("eau") else "s")
    return singular, plural, gender


def _build_tail() -> Tuple[List[tuple], List[str]]:
    """Invented nouns (in CORE_NOUNS' format) and names, distinct from every other word."""
    rng = random.Random(LEXICON_SEED)
    taken = {word for entry in CORE_NOUNS for word in entry[:2]}
    taken.update(option[i] for entry in CORE_NOUNS for option in entry[2] for i in (0, 1))
    nouns = []
    while len(nouns) < TAIL_NOUNS:
        english = _english_word(rng)
        singular, plural, gender = _french_word(rng)
        forms = {english, _english_plural(english), singular, plural}
        if len(forms) < 4 or forms & taken or len(english) < 3:
            continue
        options = [(singular, plural, gender, 1.0)]
        if rng.random() < TAIL_SYNONYMS:  # a second, less frequent translation
            synonym, synonym_plural, synonym_gender = _french_word(rng)
            if not {synonym, synonym_plural} & (taken | forms):
                forms |= {synonym, synonym_plural}
                options = [(singular, plural, gender, 0.6), (synonym, synonym_plural, synonym_gender, 0.4)]
        taken.update(forms)
        nouns.append((english, _english_plural(english), options))
    names = []
    while len(names) < NAMES:
        name = (rng.choice(_EN_ONSETS) + rng.choice(_FR_VOWELS[:5]) + rng.choice(_FR_ONSETS)
                + rng.choice(("a", "o", "i", "en", "el", "ine", "us"))).capitalize()
        if name.lower() not in taken:
            taken.add(name.lower())
            names.append(name)
    return nouns, names


TAIL, PERSON_NAMES = _build_tail()
