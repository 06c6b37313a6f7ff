"""The synthetic demo corpus: seeded, held-out, and carrying the phenomena it promises."""

from collections import Counter
from statistics import mean

from fairseq_headprune.corpora.demo_corpus import generate_corpus, write_demo_corpus
from fairseq_headprune.corpora.demo_lexicon import (
    AMBIGUOUS_NOUNS,
    CORE_NOUNS,
    PERSON_NAMES,
    POST_ADJECTIVES,
    TAIL,
    TAIL_NOUNS,
)


def test_same_seed_same_corpus_other_seed_other_corpus():
    assert generate_corpus(200, seed=5) == generate_corpus(200, seed=5)
    assert generate_corpus(200, seed=5) != generate_corpus(200, seed=6)


def test_held_out_splits_do_not_repeat_training_sentences(tmp_path):
    counts = write_demo_corpus(str(tmp_path), seed=2, scale=0.05)
    train = set((tmp_path / "train.en").read_text().splitlines())
    for split in ("valid", "test", "test-shifted"):
        held_out = (tmp_path / f"{split}.en").read_text().splitlines()
        assert len(held_out) == counts[split] > 0
        assert not train & set(held_out)
        assert len((tmp_path / f"{split}.fr").read_text().splitlines()) == len(held_out)


def test_colour_adjectives_are_reordered_after_the_noun():
    english_noun = {n[0]: {option[0] for option in n[2]} for n in CORE_NOUNS}
    colours = {a[0]: {form for option in a[1] for form in option[:4]} for a in POST_ADJECTIVES}
    checked = 0
    for english, french in generate_corpus(2000, seed=1):
        words = english.split()
        for i in range(len(words) - 1):
            if words[i] in colours and words[i + 1] in english_noun:
                fr = french.split()
                nouns = [w for w in fr if w in english_noun[words[i + 1]]]
                if len(nouns) != 1:
                    continue
                position = fr.index(nouns[0])
                assert fr[position + 1] in colours[words[i]], (english, french)
                checked += 1
    assert checked > 100


def test_main_verb_agrees_with_a_plural_subject_across_a_relative_clause():
    found = 0
    for english, french in generate_corpus(3000, seed=1):
        words = english.split()
        if words[0] == "the" and words[2] == "that" and words[1].endswith("s") and "." in words:
            # plural head noun (e.g. "the cats that ..."): a french 3pl verb must follow
            if french.startswith("les "):
                assert any(w.endswith("ent") or w == "ont" for w in french.split()), french
                found += 1
    assert found > 10


def test_ambiguous_nouns_are_translated_by_the_verb_that_selects_their_sense():
    checked = 0
    for english, french in generate_corpus(4000, seed=3):
        words = english.split()
        for en_sg, en_pl, senses in AMBIGUOUS_NOUNS:
            if en_sg not in words and en_pl not in words:
                continue
            for (fr_sg, fr_pl, _), transitive, intransitive in senses:
                cues = {form for verb in transitive + intransitive for form in verb[:3]}
                if cues & set(words):
                    assert fr_sg in french.split() or fr_pl in french.split(), (english, french)
                    checked += 1
    assert checked > 100


def test_synonyms_make_the_sampled_reference_differ_from_the_majority_one():
    sampled = generate_corpus(1000, seed=4)
    majority = generate_corpus(1000, seed=4, majority=True)
    assert [e for e, _ in sampled] == [e for e, _ in majority]  # the same sentences
    differing = sum(s != m for (_, s), (_, m) in zip(sampled, majority))
    assert 0.2 * len(sampled) < differing < 0.9 * len(sampled)
    # the majority corpus always takes the first option
    checked = 0
    for english, french in majority[:300]:
        words = english.split()
        for en_sg, en_pl, options in CORE_NOUNS:
            if en_sg in words or en_pl in words:
                assert {options[0][0], options[0][1]} & set(french.split()), (english, french)
                checked += 1
    assert checked > 100


def test_the_long_tail_is_part_of_the_language_and_mostly_rare():
    assert len(TAIL) == TAIL_NOUNS and len(set(n[0] for n in TAIL)) == TAIL_NOUNS
    assert len(set(PERSON_NAMES)) == len(PERSON_NAMES)
    # the lexicon does not depend on the corpus seed: both seeds draw from one tail
    tail_words = {n[0] for n in TAIL} | {n[1] for n in TAIL}
    counts = Counter(w for e, _ in generate_corpus(5000, seed=1) for w in e.split() if w in tail_words)
    other = Counter(w for e, _ in generate_corpus(5000, seed=2) for w in e.split() if w in tail_words)
    assert set(counts) & set(other)
    assert sum(1 for c in counts.values() if c < 5) > 0.5 * len(counts) > 100  # mostly rare words
    names = Counter(w for e, _ in generate_corpus(3000, seed=1) for w in e.split() if w in set(PERSON_NAMES))
    for english, french in generate_corpus(300, seed=1):
        for name in set(english.split()) & set(PERSON_NAMES):
            assert name in french.split()  # names are copied
    assert len(names) > 50


def test_elision_before_a_vowel():
    for english, french in generate_corpus(3000, seed=1):
        tokens = french.split()
        for article, following in zip(tokens, tokens[1:]):
            if following[0] in "aeiouéè":
                assert article not in ("le", "la", "ma", "sa", "ce"), french


def test_shifted_domain_is_longer_and_coordinates_more():
    news = generate_corpus(1000, seed=1, domain="news")
    shifted = generate_corpus(1000, seed=1, domain="shifted")
    assert mean(len(e.split()) for e, _ in shifted) > mean(len(e.split()) for e, _ in news) + 1
    assert sum(" and " in e for e, _ in shifted) > 5 * sum(" and " in e for e, _ in news) > 0


def test_sentence_adverbials_end_the_english_and_either_end_or_start_the_french():
    fronted = final = 0
    for (english, french), (_, majority) in zip(generate_corpus(2000, seed=5),
                                                generate_corpus(2000, seed=5, majority=True)):
        if english.endswith(("yesterday .", "last night .", "today .")):
            words = {"yesterday": "hier", "night": "hier soir", "today": "aujourd'hui"}[english.split()[-2]]
            if french.startswith(words + " ,"):
                fronted += 1
            else:
                assert french.endswith(words + " ."), french
                final += 1
            assert majority.endswith(words + " ."), majority  # the majority reference never fronts
    assert fronted > 30 and final > 30
