#!/usr/bin/env python
"""The GPU path's equivalence checks in a few minutes, on a tiny model prepared on the CPU beforehand.

`bash scripts/dev/gpu_check.sh --quick` runs it on the GPU; `--device cpu` runs the
same checks on the CPU path. The tiny model is the test suite's (tests/conftest.py,
trained into HEADPRUNE_TEST_CACHE by `bash scripts/dev/prepare_gpu_check.sh CACHE`):
this script trains nothing, it loads and checks.

1. masked = zeroed, for each attention type (Enc-Enc, Enc-Dec, Dec-Dec), in fp32
   and fp16: the masked model's logits against a copy whose masked heads'
   output-projection columns are zeroed, and the sweep's way (the three masks
   translated together in one batch, rows carrying their masks, encoder passes
   shared) against each zeroed copy translated alone, hypothesis for hypothesis
   (all in fp32; in fp16, where batches of other shapes round otherwise, 95%).
2. importance on the device (its batch chosen for the device) against the CPU's.
3. a fine-tune step with heads held masked (compress's and prune's fairseq-train
   run, `engine.finetune.held.finetune_held`, dropout off) on the device against the
   same step on the CPU: the masked heads' weights unchanged on both, the
   validation loss of the two results alike, the updates alike.

Prints one line per check and exits 1 if any fails.

usage: scripts/dev/device_check.py --cache DIR [--device cuda|cpu] [--json FILE]
"""

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import warnings

import torch

from fairseq_headprune.engine.runtime.console import quiet_libraries

SPECS = {"enc-enc": "E:1:3,5 E:2:1", "enc-dec": "A:1:2 A:2:4-6", "dec-dec": "D:1:1,8 D:2:2"}
FINETUNE_SPEC = "E:1:1-2 A:2:keep=3 D:1:4"
GENERATION = ["--beam", "4", "--batch-size", "64", "--max-len-b", "40", "--required-batch-size-multiple", "1"]
LOGIT_TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2}  # absolute, on logits of magnitude about 10
# hypotheses alike, masks batched against each zeroed copy alone: in fp16 a batch of another shape rounds otherwise
# (on 2 CPU cores 196-198 of the 200 sentences agreed, the logits within 0.014)
HYPOTHESIS_AGREEMENT = {"fp32": 1.0, "fp16": 0.95}
IMPORTANCE_TOLERANCE = 1e-4  # relative to the largest head's importance (issue 64 saw 5.9e-6 on an H100)
LOSS_TOLERANCE = 1e-4  # relative, the validation loss after the fine-tune step
UPDATE_AGREEMENT = 0.99  # share of the updated weights whose updates agree within 1% of the largest update

warnings.filterwarnings("ignore")


class Report:
    """Each check's line and numbers; failures counted."""

    def __init__(self):
        self.checks, self.failed = [], 0

    def add(self, name, passed, **numbers):
        self.failed += not passed
        self.checks.append({"check": name, "passed": bool(passed), **numbers})
        shown = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in numbers.items())
        print(f"{'PASS' if passed else 'FAIL'}  {name}: {shown}", flush=True)


def zeroed_copy(model, head_mask):
    """``model`` with the masked heads' output-projection columns zeroed and no mask: the reference."""
    from fairseq_headprune.modules.masked_multihead_attention import attention_modules, set_head_mask

    zeroed = copy.deepcopy(model)
    set_head_mask(zeroed, None)
    for (attention_type, layer), module in attention_modules(zeroed).items():
        for head, xi in enumerate(head_mask[attention_type][layer].tolist()):
            if xi == 0.0:
                module.out_proj.weight.data[:, head * module.head_dim:(head + 1) * module.head_dim] = 0.0
    return zeroed


def load(paths, device, *extra):
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model

    return load_generation_model(paths["data"], paths["checkpoint"], [*GENERATION, *extra], cpu=device == "cpu")


def masked_equals_zeroed(paths, device, report):
    """Check 1, in both precisions."""
    from fairseq_headprune.engine.runners.batches import iterate_samples, model_device, split_batches
    from fairseq_headprune.engine.runners.translator import SplitTranslator
    from fairseq_headprune.modules.masked_multihead_attention import head_layout, head_mask_applied
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    for precision, options in (("fp32", ()), ("fp16", ("--fp16",))):
        cfg, task, model = load(paths, device, *options)
        masks = {t: parse_head_mask(spec, head_layout(model)) for t, spec in SPECS.items()}
        translator = SplitTranslator(cfg, task, model, "valid")  # halves the model in fp16
        dataset, batches = split_batches(task, "valid", max_sentences=32, limit=32)
        sample = next(iterate_samples(dataset, batches[:1], model_device(model)))
        batched = translator.translate_many(list(masks.values()))
        for (attention_type, mask), translated in zip(masks.items(), batched):
            zeroed = zeroed_copy(model, mask)
            with torch.no_grad():
                with head_mask_applied(model, mask):
                    masked_logits = model(**sample["net_input"])[0].float()
                reference = zeroed(**sample["net_input"])[0].float()
                unmasked = model(**sample["net_input"])[0].float()
            difference = (masked_logits - reference).abs().max().item()
            effect = (masked_logits - unmasked).abs().max().item()
            alone = SplitTranslator(cfg, task, zeroed, "valid").translate(None).hypotheses
            same = sum(a == b for a, b in zip(translated.hypotheses, alone))
            tolerance = LOGIT_TOLERANCE[precision]
            report.add(f"masked = zeroed, {attention_type} ({SPECS[attention_type]}), {precision}",
                       difference <= tolerance < effect and same >= HYPOTHESIS_AGREEMENT[precision] * len(alone),
                       max_logit_difference=difference, mask_effect=effect,
                       same_hypotheses=f"{same}/{len(alone)} (3 masks batched vs zeroed alone)")
            del zeroed


def importance_matches_the_cpu(paths, device, report):
    """Check 2."""
    from fairseq_headprune.engine.importance.translation import ImportanceEstimator
    from fairseq_headprune.study.settings import ImportanceSettings

    scores = {}
    for where in dict.fromkeys([device, "cpu"]):
        _, task, model = load(paths, where)
        # the device's batch is left open (chosen for it, and stated); the CPU's is its default
        result = ImportanceEstimator(task, model, ImportanceSettings(subsets=["valid"])).estimate(None,
                                                                                                 progress=False)
        scores[where] = torch.cat([t.flatten() for _, t in sorted(result.importance.items())]).double().cpu()
    error = ((scores[device] - scores["cpu"]).abs().max() / scores["cpu"].abs().max()).item()
    report.add(f"importance on {device} against the CPU", error <= IMPORTANCE_TOLERANCE,
               max_relative_error=error, heads=int(scores["cpu"].numel()))


def finetune_step(paths, start, device, out_dir):
    """The start checkpoint trained for one update on ``device``; the trained checkpoint's path."""
    from fairseq_headprune.engine.finetune.held import finetune_held
    from fairseq_headprune.study.finetune.settings import FinetuneSettings

    settings = FinetuneSettings(updates=1, lr=1e-4, warmup=0)
    return finetune_held(start, paths["data"], os.path.join(out_dir, device), "translation", settings,
                         cpu=device == "cpu", progress=False).checkpoint


def dropout_free_start(paths, out_dir):
    """The tiny checkpoint with FINETUNE_SPEC masked and recorded, as fine-tuning starts, dropout off."""
    from fairseq_headprune.engine.checkpoints.info import (
        checkpoint_head_layout,
        load_checkpoint_state,
        model_config_object,
    )
    from fairseq_headprune.engine.finetune.held import write_masked_start
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    start = os.path.join(out_dir, "start.pt")
    head_mask = parse_head_mask(FINETUNE_SPEC, checkpoint_head_layout(paths["checkpoint"]))
    write_masked_start(paths["checkpoint"], start, head_mask, None)
    state = load_checkpoint_state(start)
    config = model_config_object(state)
    for name in ("dropout", "attention_dropout", "activation_dropout", "relu_dropout"):
        if hasattr(config, name):
            setattr(config, name, 0.0)  # the devices draw different dropout masks: the check compares the rest
    torch.save(state, start)
    return start


def validation_loss(paths, checkpoint):
    """Mean token cross-entropy of ``checkpoint`` on 32 validation sentences, on the CPU."""
    from fairseq_headprune.engine.checkpoints.loading import load_generation_model
    from fairseq_headprune.engine.runners.batches import iterate_samples, split_batches

    _, task, model = load_generation_model(paths["data"], checkpoint, cpu=True)
    dataset, batches = split_batches(task, "valid", max_sentences=32, limit=32)
    sample = next(iterate_samples(dataset, batches[:1], torch.device("cpu")))
    with torch.no_grad():
        lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True).double()
    target = sample["target"]
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return (nll[target != task.target_dictionary.pad()]).mean().item()


def masked_slices(weights, spec_layout):
    """The q/k/v rows and output-projection columns of every head FINETUNE_SPEC masks."""
    from fairseq_headprune.study.masks.head_mask import parse_head_mask

    prefixes = {"enc-enc": "encoder.layers.{}.self_attn.", "enc-dec": "decoder.layers.{}.encoder_attn.",
                "dec-dec": "decoder.layers.{}.self_attn."}
    mask = parse_head_mask(FINETUNE_SPEC, spec_layout)
    slices = []
    for attention_type, rows in mask.items():
        for layer, row in enumerate(rows.tolist()):
            prefix = prefixes[attention_type].format(layer)
            width = weights[prefix + "q_proj.weight"].size(0) // len(row)
            for head in (h for h, xi in enumerate(row) if xi == 0.0):
                part = slice(head * width, (head + 1) * width)
                slices += [weights[prefix + f"{p}_proj.weight"][part] for p in "qkv"]
                slices.append(weights[prefix + "out_proj.weight"][:, part])
    return slices


def finetune_matches_the_cpu(paths, device, report):
    """Check 3."""
    from fairseq_headprune.engine.checkpoints.info import load_checkpoint_state

    with tempfile.TemporaryDirectory(prefix="device_check.") as out_dir:
        start = dropout_free_start(paths, out_dir)
        trained = {where: finetune_step(paths, start, where, out_dir) for where in dict.fromkeys(["cpu", device])}
        before = load_checkpoint_state(start)["model"]
        after = {where: load_checkpoint_state(path)["model"] for where, path in trained.items()}
        layout = {"enc-enc": (2, 8), "enc-dec": (2, 8), "dec-dec": (2, 8)}
        held = all(torch.equal(old, new) for where in after for old, new in
                   zip(masked_slices(before, layout), masked_slices(after[where], layout)))
        updates = {where: torch.cat([(weights[k].double() - before[k].double()).flatten() for k in sorted(before)
                                     if before[k].is_floating_point()]) for where, weights in after.items()}
        largest = updates["cpu"].abs().max().item()
        moved = updates["cpu"] != 0
        agree = ((updates[device] - updates["cpu"]).abs() <= 0.01 * largest)[moved].double().mean().item()
        losses = {where: validation_loss(paths, path) for where, path in trained.items()}
        difference = abs(losses[device] - losses["cpu"]) / losses["cpu"]
    report.add(f"fine-tune step with {FINETUNE_SPEC} held, {device} against the CPU",
               held and largest > 0 and difference <= LOSS_TOLERANCE and agree >= UPDATE_AGREEMENT,
               masked_heads_unchanged=held, loss_relative_difference=difference,
               updates_agreeing=agree, largest_update=largest)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", required=True, metavar="DIR",
                        help="the tiny model: HEADPRUNE_TEST_CACHE as the tests and prepare_gpu_check.sh fill it "
                        "(DIR/bin, DIR/checkpoints/checkpoint_last.pt)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where to check (default: cuda)")
    parser.add_argument("--json", metavar="FILE", help="also write the checks and their numbers as JSON")
    args = parser.parse_args()
    paths = {"data": os.path.join(args.cache, "bin"),
             "checkpoint": os.path.join(args.cache, "checkpoints", "checkpoint_last.pt")}
    if not os.path.isfile(paths["checkpoint"]):
        sys.exit(f"device_check: error: no tiny model in {args.cache} (prepare it on any machine: "
                 "bash scripts/dev/prepare_gpu_check.sh DIR)")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("device_check: error: --device cuda, but torch sees no GPU (--device cpu checks the CPU path)")
    quiet_libraries()
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"device check on {args.device} ({name}), torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"tiny model {paths['checkpoint']}", flush=True)
    report, began = Report(), time.perf_counter()
    for check in (masked_equals_zeroed, importance_matches_the_cpu, finetune_matches_the_cpu):
        check(paths, args.device, report)
    seconds = time.perf_counter() - began
    print(f"{len(report.checks) - report.failed} of {len(report.checks)} checks passed in {seconds:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump({"device": args.device, "device_name": name, "torch": torch.__version__, "seconds": seconds,
                       "checks": report.checks}, stream, indent=1)
    sys.exit(1 if report.failed else 0)


if __name__ == "__main__":
    main()
