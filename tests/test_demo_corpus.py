"""The synthetic demo corpus: seeded, held-out, and carrying the phenomena it promises."""

from statistics import mean

from fairseq_headprune.study.demo_corpus import (
    NOUNS,
    POST_ADJECTIVES,
    generate_corpus,
    write_demo_corpus,
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
    english_noun = {n[0]: n[2] for n in NOUNS}
    colours = {a[0]: a[1:] for a in POST_ADJECTIVES}
    checked = 0
    for english, french in generate_corpus(2000, seed=1):
        words = english.split()
        for i in range(len(words) - 1):
            if words[i] in colours and words[i + 1] in english_noun:
                noun = english_noun[words[i + 1]]
                fr = french.split()
                if fr.count(noun) != 1:
                    continue
                position = fr.index(noun)
                assert fr[position + 1] in colours[words[i]]
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


def test_shifted_domain_is_longer_and_coordinates_more():
    news = generate_corpus(1000, seed=1, domain="news")
    shifted = generate_corpus(1000, seed=1, domain="shifted")
    assert mean(len(e.split()) for e, _ in shifted) > mean(len(e.split()) for e, _ in news) + 1
    assert sum(" and " in e for e, _ in shifted) > 5 * sum(" and " in e for e, _ in news) > 0
