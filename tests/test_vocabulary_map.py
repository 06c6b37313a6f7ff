"""CTranslate2's vocabulary map: Dice's coefficient by brute force, and the engine restricted to the map's candidates.

References: the coefficient computed directly from a sentence-by-token
incidence matrix (numpy), and CTranslate2's own translations with
``use_vmap=True``, whose every token must be a candidate of its source as the
written vmap.txt lists them (read back by a parser written here).
"""

import numpy as np
import pytest

from conftest import run

PAIRS = [("a b c".split(), "x y z".split()), ("a b".split(), "x y".split()), ("a d".split(), "x w".split()),
         ("c d".split(), "z w".split()), ("b".split(), "y y".split()), ("d e".split(), "w v".split())]


def test_candidates_are_the_highest_dice_coefficients_and_common_tokens_the_most_frequent():
    from fairseq_headprune.study.compression.vocabulary_map import build_vocabulary_map, vocabulary_map_coverage

    sources = sorted({t for s, _ in PAIRS for t in s})
    targets = sorted({t for _, t in PAIRS for t in t})
    source_matrix = np.array([[t in set(s) for t in sources] for s, _ in PAIRS], dtype=float)
    target_matrix = np.array([[t in set(u) for t in targets] for _, u in PAIRS], dtype=float)
    together = source_matrix.T @ target_matrix  # sentences holding both
    dice = 2 * together / (source_matrix.sum(0)[:, None] + target_matrix.sum(0)[None, :])
    vocabulary_map = build_vocabulary_map(PAIRS, per_token=2, common=1)
    for i, token in enumerate(sources):
        order = sorted((t for t in range(len(targets)) if together[i, t] > 0), key=lambda t: (-dice[i, t], targets[t]))
        assert vocabulary_map.candidates[token] == [targets[t] for t in order[:2]], token
    assert vocabulary_map.common == ["y"]  # 4 occurrences (twice in one sentence)
    assert vocabulary_map.lines()[0] == "\ty"
    assert vocabulary_map_coverage(vocabulary_map, PAIRS) == 1.0
    assert vocabulary_map_coverage(vocabulary_map, [(["e"], ["x"])]) == 0.0  # x is not e's candidate nor common


def read_vmap(path):
    """vmap.txt as CTranslate2 documents it: `n-gram <tab> candidates`, the empty n-gram always allowed."""
    rules = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, values = line.partition("\t")
        rules[key] = values.split()
    return rules


def test_an_exported_vocabulary_map_restricts_ctranslate2_to_its_candidates(tiny_model, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from test_export import batches_of, fairseq_model, tokens

    out = tmp_path / "ct2"
    result = run(["fairseq-headprune", "export", tiny_model["data"], "--path", tiny_model["checkpoint"], "--out-dir",
                  out, "--cpu", "--vocabulary-map", "--vocabulary-map-candidates", "3", "--vocabulary-map-common", "5"])
    assert "vocabulary map\tvmap.txt: 3 candidates per source token, 5 always; it covers" in result.stdout
    rules = read_vmap(out / "vmap.txt")
    assert len(rules[""]) == 5 and all(len(v) <= 3 for k, v in rules.items() if k)
    _, task, _ = fairseq_model(tiny_model)
    dataset, batches = batches_of(task, limit=40)
    sources = [tokens(task.source_dictionary, dataset[i]["source"].tolist()) for batch in batches for i in batch]
    translator = ctranslate2.Translator(str(out), device="cpu")
    outside = 0
    for source in sources:  # one sentence a batch: its own candidates (CTranslate2 takes a batch's union)
        mapped = translator.translate_batch([source], beam_size=2, max_decoding_length=40, use_vmap=True)[0]
        unmapped = translator.translate_batch([source], beam_size=2, max_decoding_length=40)[0]
        allowed = set(rules[""]) | {t for s in source for t in rules.get(s, [])} | {"<unk>", "</s>", "<s>"}
        assert set(mapped.hypotheses[0]) <= allowed, (source, mapped.hypotheses[0])
        outside += len(set(unmapped.hypotheses[0]) - allowed)
    assert outside > 0  # with 3 candidates a token, the unrestricted model uses tokens the map leaves out
