"""fairseq's own commands with --user-dir fairseq_headprune and --head-mask."""

import re

import pytest

from conftest import USER_DIR, run, validate_loss

BLEU = re.compile(r"BLEU4 = ([\d.]+)")


def generate(tiny_model, *extra, check=True):
    return run(
        [
            "fairseq-generate", tiny_model["data"], "--path", tiny_model["checkpoint"],
            "--user-dir", USER_DIR, "--gen-subset", "test", "--beam", "4",
            "--batch-size", "64", "--seed", "1", *extra,
        ],
        check=check,
    )


def hypotheses(output):
    return sorted(line for line in output.splitlines() if line.startswith("H-"))


def source_sentences(tiny_model):
    return (tiny_model["raw"] / "test.en").read_text().splitlines()


def bleu(output):
    return float(BLEU.search(output).group(1))


def test_generate_unmasked_equals_plain_translation_task(tiny_model):
    plain = generate(tiny_model, "--task", "translation").stdout
    ours = generate(tiny_model, "--task", "fairseq-headprune").stdout
    explicit_none = generate(tiny_model, "--task", "fairseq-headprune", "--head-mask", "none").stdout
    assert len(hypotheses(plain)) == len(source_sentences(tiny_model)) > 0
    assert hypotheses(ours) == hypotheses(plain)
    assert hypotheses(explicit_none) == hypotheses(plain)
    assert bleu(ours) == bleu(plain)
    # the demo corpus's ceiling is about 68 BLEU (one sampled reference of several acceptable ones)
    assert bleu(plain) > 25, "the tiny model should translate its synthetic test set"


def test_generate_with_a_mask_changes_bleu(tiny_model):
    base = bleu(generate(tiny_model, "--task", "fairseq-headprune").stdout)
    masked = generate(tiny_model, "--task", "fairseq-headprune", "--head-mask", "A:2:*")
    assert bleu(masked.stdout) < base - 1.0
    assert "masking 8 heads: A:2:*" in masked.stderr


def test_our_command_wraps_generate(tiny_model):
    ours = run(
        ["fairseq-headprune", "generate", tiny_model["data"], "--path", tiny_model["checkpoint"],
         "--gen-subset", "test", "--beam", "4", "--batch-size", "64", "--head-mask", "E:1:1,2 A:2:1,3"]
    ).stdout
    direct = generate(tiny_model, "--task", "fairseq-headprune", "--head-mask", "E:1:1,2 A:2:1,3").stdout
    # every test sentence translated, by both routes, and the mask applied by both
    assert len(hypotheses(ours)) == len(source_sentences(tiny_model)) > 0
    assert hypotheses(ours) == hypotheses(direct)
    assert hypotheses(ours) != hypotheses(generate(tiny_model, "--task", "fairseq-headprune").stdout)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("E:3:1", "layer 3 out of range 1-2"),
        ("A:1:9", "head 9 out of range 1-8"),
        ("Z:1:1", "unknown attention type"),
        ("E:1", "malformed term"),
        ("", "empty head-mask spec"),
    ],
)
def test_bad_head_mask_is_one_line_and_nonzero(tiny_model, spec, message):
    result = generate(tiny_model, "--task", "fairseq-headprune", "--head-mask", spec, check=False)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("fairseq-headprune: error: --head-mask:") and message in last


def test_validate_with_a_mask(tiny_model):
    base = validate_loss(tiny_model)
    assert validate_loss(tiny_model, "--head-mask", "none") == base
    assert validate_loss(tiny_model, "--head-mask", "A:*:*") > base + 0.1


def test_interactive_with_a_mask(tiny_model):
    source = (tiny_model["raw"] / "test.en").read_text().splitlines()[:5]

    def translate(*extra):
        result = run(
            ["bash", "-c", 'printf "%s\\n" "$@" | fairseq-interactive ' + " ".join(
                [str(tiny_model["data"]), "--path", str(tiny_model["checkpoint"]),
                 "--user-dir", USER_DIR, "--task", "fairseq-headprune", "--beam", "4",
                 "--source-lang", "en", "--target-lang", "fr", *extra]) , "_", *source]
        )
        return [line.split("\t")[2] for line in result.stdout.splitlines() if line.startswith("H-")]

    unmasked = translate()
    assert len(unmasked) == 5
    assert translate("--head-mask", "'A:*:*'") != unmasked


def test_train_with_a_mask(tiny_model, tmp_path):
    result = run(
        ["fairseq-train", tiny_model["data"], "--user-dir", USER_DIR, "--task", "fairseq-headprune",
         "--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1",
         "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
         "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
         "--head-mask", "E:1:1 D:1:keep=2", "--optimizer", "adam", "--lr", "0.001",
         "--max-tokens", "1024", "--max-update", "3", "--save-dir", tmp_path,
         "--no-save", "--num-workers", "0", "--log-format", "simple"]
    )
    log = result.stdout + result.stderr
    assert "masking 4 heads: E:1:1 D:1:keep=2" in log
    assert "done training" in log


def test_validate_honours_the_task_for_a_translation_checkpoint(tiny_model, tmp_path):
    """A checkpoint saved by --task translation still gets --head-mask applied."""
    import torch

    import fairseq_headprune.compat.torch_load  # noqa: F401  (its allow-list lets torch.load read checkpoints)

    state = torch.load(tiny_model["checkpoint"], map_location="cpu")
    state["cfg"]["task"]["_name"] = "translation"
    del state["cfg"]["task"]["head_mask"]
    translation_checkpoint = tmp_path / "translation.pt"
    torch.save(state, translation_checkpoint)
    model = dict(tiny_model, checkpoint=translation_checkpoint)
    assert validate_loss(model, "--head-mask", "A:*:*") > validate_loss(model) + 0.1


def test_our_train_records_the_direction_and_a_reversed_pair_is_refused(tiny_model, tmp_path):
    """fairseq keeps a language pair it inferred out of the checkpoint; ``fairseq-headprune train`` gives the pair
    fairseq would infer, so the checkpoint records it and ``-s fr -t en`` on it is refused in one line."""
    import torch

    run(["fairseq-headprune", "train", tiny_model["data"], "--arch", "transformer",
         "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4", "--share-all-embeddings", "--optimizer", "adam", "--lr", "0.001",
         "--max-tokens", "1024", "--max-update", "1", "--save-dir", tmp_path / "checkpoints", "--num-workers", "0",
         "--log-format", "simple", "--no-epoch-checkpoints"])
    checkpoint = tmp_path / "checkpoints" / "checkpoint_last.pt"
    task = torch.load(checkpoint, map_location="cpu", weights_only=False)["cfg"]["task"]
    assert (task["source_lang"], task["target_lang"]) == ("en", "fr")
    reversed_pair = run(["fairseq-headprune", "importance", tiny_model["data"], "--path", checkpoint, "--out-dir",
                         tmp_path / "importance", "-s", "fr", "-t", "en", "--importance-limit", "4"], check=False)
    assert reversed_pair.returncode == 2 and len(reversed_pair.stderr.strip().splitlines()) == 1
    assert "translates en-fr, not fr-en" in reversed_pair.stderr
