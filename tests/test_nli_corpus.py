"""The synthetic NLI corpus: seeded, balanced, held out, and its labels what the premise implies."""

from collections import Counter
from statistics import mean

from fairseq_headprune.corpora.demo_lexicon import CORE_NOUNS, INTRANSITIVE_VERBS, TAIL, TRANSITIVE_VERBS
from fairseq_headprune.corpora.nli_corpus import NLI_LABELS, generate_inference, write_inference_corpus

NEGATION = {"not", "does", "do", "did"}
# every form of a word -> one form: verbs (3sg, base, past) and nouns (plural), determiners by number
LEMMA = {form: verb[1] for verb in TRANSITIVE_VERBS + INTRANSITIVE_VERBS for form in verb[:3]}
LEMMA.update({noun[1]: noun[0] for noun in CORE_NOUNS + TAIL})
LEMMA.update({"some": "a", "these": "this"})
VERBS = {verb[1] for verb in TRANSITIVE_VERBS + INTRANSITIVE_VERBS}
NOUNS = {noun[0] for noun in CORE_NOUNS + TAIL}


def content(sentence):
    """The lemmas of a sentence without the period and the negation's auxiliaries."""
    return [LEMMA.get(word, word) for word in sentence.split() if word != "." and word not in NEGATION]


def phrases(sentence):
    """(subject, object) of a sentence without relative clauses: the lemmas before the verb, and after it to
    the noun."""
    words = content(sentence)
    verb = next(i for i, word in enumerate(words) if word in VERBS)
    after = words[verb + 1:]
    end = next((i for i, word in enumerate(after) if word in NOUNS), -1)
    return words[:verb], after[:end + 1]


def negated(sentence):
    return "not" in sentence.split()


def test_same_seed_same_corpus_other_seed_other_corpus():
    assert generate_inference(120, seed=3) == generate_inference(120, seed=3)
    assert generate_inference(120, seed=3) != generate_inference(120, seed=4)


def test_labels_come_in_equal_shares_and_pairs_are_distinct():
    examples = generate_inference(900, seed=1)
    assert Counter(label for _, _, label in examples) == {label: 300 for label in NLI_LABELS}
    assert len({(premise, hypothesis) for premise, hypothesis, _ in examples}) == 900
    assert all(premise != hypothesis for premise, hypothesis, _ in examples)


def test_entailment_and_contradiction_say_only_what_the_premise_says():
    """Their hypotheses take every word from the premise; entailment keeps a restated event's polarity."""
    examples = generate_inference(1500, seed=2)
    restated = {"entailment": 0, "contradiction": 0}
    for premise, hypothesis, label in examples:
        if label == "neutral":
            continue
        assert set(content(hypothesis)) <= set(content(premise)), (premise, hypothesis)
        if "that" not in premise.split():  # the main event restated: polarity decides the label
            restated[label] += 1
            assert negated(hypothesis) == (negated(premise) == (label == "entailment")), (premise, hypothesis, label)
    assert min(restated.values()) > 100


def test_neutral_hypotheses_add_something_the_premise_lacks_or_swap_roles():
    examples = generate_inference(1500, seed=2)
    added = swapped = 0
    for premise, hypothesis, label in examples:
        if label != "neutral":
            continue
        if "that" in premise.split():
            swapped += 1  # or a clause's roles swapped, or its other participant doing the main verb
        else:  # a phrase of the hypothesis says more than the premise's phrase it restates
            assert any(set(said) - set(given) for said, given in zip(phrases(hypothesis), phrases(premise))), (
                premise, hypothesis)
            added += 1
    assert added > 250 and swapped > 100


def test_held_out_premises_are_not_trained_on_and_the_mismatched_domain_differs(tmp_path):
    counts = write_inference_corpus(str(tmp_path), seed=1, scale=0.05)
    assert set(counts) == {"train", "valid", "test", "test-mismatched"}
    train = set((tmp_path / "train.input0").read_text().splitlines())
    lengths = {}
    for split in ("valid", "test", "test-mismatched"):
        premises = (tmp_path / f"{split}.input0").read_text().splitlines()
        assert len(premises) == counts[split] == len((tmp_path / f"{split}.label").read_text().splitlines())
        assert len((tmp_path / f"{split}.input1").read_text().splitlines()) == len(premises)
        assert not train & set(premises)
        lengths[split] = mean(len(p.split()) for p in premises)
    assert lengths["test-mismatched"] > lengths["test"] + 1  # more clauses and modifiers
