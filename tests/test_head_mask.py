"""Head-mask specs: the grammar, errors, files and the spec <-> tensor round trip."""

import json
import random

import pytest
import torch

from fairseq_headprune.errors import HeadMaskError
from fairseq_headprune.study.masks.head_mask import (
    count_masked,
    full_mask,
    head_mask_to_spec,
    masked_heads,
    parse_head_mask,
    same_units_masked,
    validate_spec_syntax,
    write_mask_file,
)

WMT_BIG = {"enc-enc": (6, 16), "enc-dec": (6, 16), "dec-dec": (6, 16)}


def masked_set(spec, layout=WMT_BIG):
    return set(masked_heads(parse_head_mask(spec, layout)))


def test_authors_descriptors():
    assert masked_set("E:1:6") == {("enc-enc", 1, 6)}
    assert masked_set("E:1:6 A:2:1,3") == {("enc-enc", 1, 6), ("enc-dec", 2, 1), ("enc-dec", 2, 3)}
    assert masked_set("D:6:16") == {("dec-dec", 6, 16)}


def test_long_names_ranges_stars_and_separators():
    assert masked_set("enc-dec:2-3:1-2") == {
        ("enc-dec", layer, head) for layer in (2, 3) for head in (1, 2)
    }
    assert masked_set("dec-dec:*:16;e:1:1") == {("dec-dec", layer, 16) for layer in range(1, 7)} | {
        ("enc-enc", 1, 1)
    }
    assert len(masked_set("A:1:*")) == 16
    assert len(masked_set("*:*:*")) == 288
    assert masked_set("none") == set()


def test_keep_only_form_masks_all_other_heads():
    masked = masked_set("E:2:keep=5")
    assert masked == {("enc-enc", 2, h) for h in range(1, 17) if h != 5}
    # all-but-one head in every layer of every type
    mask = parse_head_mask("*:*:keep=1", WMT_BIG)
    assert all(torch.equal(m.sum(1), torch.ones(6)) for m in mask.values())


def test_terms_add_up():
    assert masked_set("E:1:1 E:1:2 E:1:1") == {("enc-enc", 1, 1), ("enc-enc", 1, 2)}


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("X:1:1", "unknown attention type"),
        ("E:7:1", "layer 7 out of range 1-6"),
        ("E:0:1", "layer 0 out of range"),
        ("E:1:17", "head 17 out of range 1-16"),
        ("E:1", "malformed term"),
        ("E:1:1:1", "malformed term"),
        ("E:1:a", "malformed head list"),
        ("E:x:1", "malformed layer list"),
        ("E:3-1:1", "empty layer range"),
        ("E:1:", "malformed term"),
        ("missing.json", "not found"),
    ],
)
def test_bad_specs_give_one_line_errors(spec, message):
    with pytest.raises(HeadMaskError) as error:
        parse_head_mask(spec, WMT_BIG)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_syntax_is_checked_before_the_layout_is_known():
    validate_spec_syntax("E:100:100 A:*:keep=3")  # range is checked later
    for bad in ("Q:1:1", "E:1", "E:1:x", ""):
        with pytest.raises(HeadMaskError):
            validate_spec_syntax(bad)


def test_missing_attention_type_in_layout():
    with pytest.raises(HeadMaskError, match="no enc-dec attention"):
        parse_head_mask("A:1:1", {"enc-enc": (2, 4)})


def random_mask(rng, layout):
    mask = full_mask(layout)
    for tensor in mask.values():
        for layer in range(tensor.size(0)):
            style = rng.random()
            if style < 0.2:
                tensor[layer] = 0.0
            elif style < 0.6:
                for head in range(tensor.size(1)):
                    if rng.random() < 0.3 + 0.6 * (style > 0.4):
                        tensor[layer, head] = 0.0
    return mask


@pytest.mark.parametrize("seed", range(25))
def test_spec_round_trip(seed):
    rng = random.Random(seed)
    layout = {"enc-enc": (rng.randint(1, 6), rng.randint(1, 16)), "enc-dec": (3, 8), "dec-dec": (2, 4)}
    mask = random_mask(rng, layout)
    spec = head_mask_to_spec(mask)
    again = parse_head_mask(spec, layout)
    for attention_type in layout:
        assert torch.equal(again[attention_type], mask[attention_type]), spec
    assert head_mask_to_spec(again) == spec


def test_masks_compare_as_masks_not_as_spec_text():
    written = parse_head_mask("E:1:1,2,3,7 A:2:keep=4", WMT_BIG)
    respelled = parse_head_mask("A:2:1-3,5-16 E:1:7,1-3", WMT_BIG)
    assert same_units_masked(written, respelled)
    assert not same_units_masked(written, parse_head_mask("E:1:1-3 A:2:keep=4", WMT_BIG))
    assert same_units_masked(None, full_mask(WMT_BIG)) and not same_units_masked(None, written)


def test_canonical_spec_is_compact():
    mask = parse_head_mask("E:1:1,2,3,7 A:2:keep=4 D:3:*", WMT_BIG)
    assert head_mask_to_spec(mask) == "E:1:1-3,7 A:2:keep=4 D:3:*"
    assert head_mask_to_spec(full_mask(WMT_BIG)) == "none"


@pytest.mark.parametrize("suffix", ["json", "tsv"])
def test_mask_files_round_trip(tmp_path, suffix):
    mask = parse_head_mask("E:1:1-3 A:6:keep=2 D:4:16", WMT_BIG)
    path = tmp_path / f"mask.{suffix}"
    write_mask_file(mask, str(path))
    again = parse_head_mask(str(path), WMT_BIG)
    assert all(torch.equal(again[t], mask[t]) for t in WMT_BIG)
    assert count_masked(again) == 3 + 15 + 1


def test_hand_written_mask_files(tmp_path):
    terms = tmp_path / "terms.json"
    terms.write_text(json.dumps(["E:1:6", "A:2:1,3"]))
    assert masked_set(str(terms)) == masked_set("E:1:6 A:2:1,3")
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"masked": {"E": {"1": [6]}, "enc-dec": {"2": [1, 3]}}}))
    assert masked_set(str(nested)) == masked_set("E:1:6 A:2:1,3")
    rows = tmp_path / "heads.tsv"
    rows.write_text("attention_type\tlayer\thead\nE\t1\t6\nenc-dec\t2\t1,3\n")
    assert masked_set(str(rows)) == masked_set("E:1:6 A:2:1,3")


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.json", "{not json", "not valid JSON"),
        ("bad2.json", json.dumps({"heads": 1}), "expected"),
        ("bad.tsv", "type\tlayer\n", "header"),
        ("bad2.tsv", "attention_type\tlayer\thead\tmask\nE\t1\t1\t2\n", "mask must be 0 or 1"),
        ("range.tsv", "attention_type\tlayer\thead\nE\t9\t1\n", "layer 9 out of range"),
    ],
)
def test_bad_mask_files(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(HeadMaskError, match=message):
        parse_head_mask(str(path), WMT_BIG)
