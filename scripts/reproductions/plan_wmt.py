#!/usr/bin/env python
"""How long will the paper's WMT studies take? Expected wall time on 1 and N GPUs.

Measures, on the device at hand, the throughput of the two kinds of work the
studies are made of, on a randomly initialised fairseq model (weights do not
change the time, but a random model never stops early, so the decoding
length is forced to --target-length):

* masked beam search as `ablate`/`prune` run it: --configs-per-batch
  configurations of --batch-size sentences in one batch, one head mask per
  sentence (the masked attention path);
* teacher-forced forward + backward to the head mask, as `importance` runs it.

The measurement runs on --measure-arch (default: the planned --arch itself)
and is scaled to --arch by the ratio of their FLOPs per sentence (analytic:
projections, attention and the output layer). A small measured model is
dominated by per-call overhead, so scaling from it overestimates. Each study's
time is then (configurations x sentences) / measured sentences per second,
divided by the number of GPUs for the sharded commands (configurations are
dealt round robin over ranks, so this assumes perfect scaling; model loading
and scoring are left out). The study sizes are the paper's (Michel et al.
2019, sections 3-4) and are printed with the table.

usage: scripts/reproductions/plan_wmt.py [--arch transformer_vaswani_wmt_en_fr_big]
           [--measure-arch ARCH] [--vocab 44512] [--heads 16]
           [--source-length 30] [--target-length 33] [--beam 4]
           [--batch-size 64] [--configs-per-batch 4] [--gpus 1 8]
           [--fp16 | --bf16] [--cpu] [--repeats 3] [--json FILE]
"""

import argparse
import statistics
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore")  # fairseq/hydra deprecation notices; the table is the output

# (study, attention types' configurations, sentences, kind) for a model with
# L layers per stack and H heads: the paper's WMT studies.  newstest2013 has
# 3,000 sentences, newstest2014 3,003, MTNT en-fr test 1,022 (assumed), and
# importance runs on newstest2009-2012 (11,020 sentences).
def wmt_studies(layers, heads):
    heads_total = 3 * layers * heads
    return [
        ("ablate --mode single (newstest2013, section 3.2)", heads_total + 1, 3000, "decode"),
        ("ablate --mode all-but-one (newstest2013, section 3.3)", heads_total + 1, 3000, "decode"),
        ("all-but-one, appendix A (select on 2013, test 2014)", heads_total + 1 + 3 * layers, 3003, "decode"),
        ("ablate --mode cross-domain (MTNT, section 3.4)", heads_total + 1, 1022, "decode"),
        ("prune, one order, 10% steps (newstest2013, section 4.2)", 10, 3000, "decode"),
        ("prune, importance + random x 5 seeds, 10% steps", 60, 3000, "decode"),
        ("importance (newstest2009-2012, section 4.1)", 1, 11020, "importance"),
    ]


def flops_per_sentence(cfg, vocab, source_length, target_length, beam):
    """Multiply-adds x 2 of one sentence: encoder once, decoder for beam x target tokens."""
    d_enc, d_dec = cfg.encoder_embed_dim, cfg.decoder_embed_dim
    encoder_token = cfg.encoder_layers * (4 * d_enc * d_enc + 2 * d_enc * cfg.encoder_ffn_embed_dim
                                          + 2 * source_length * d_enc)
    # enc-dec keys and values: once per source token
    encoder_token += cfg.decoder_layers * 2 * d_enc * d_dec
    decoder_token = cfg.decoder_layers * (
        4 * d_dec * d_dec + 2 * d_dec * d_dec + 2 * d_dec * cfg.decoder_ffn_embed_dim
        + target_length * d_dec + 2 * source_length * d_dec
    ) + d_dec * vocab
    return 2 * (source_length * encoder_token + beam * target_length * decoder_token)


def build_model(arch, vocab, heads, device, dtype):
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    dictionary = Dictionary()
    for index in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{index}")
    cfg = argparse.Namespace(arch=arch, share_all_embeddings=True, encoder_attention_heads=heads,
                             decoder_attention_heads=heads)
    ARCH_CONFIG_REGISTRY[arch](cfg)
    owner = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    model = ARCH_MODEL_REGISTRY[arch].build_model(cfg, owner).to(device=device, dtype=dtype).eval()
    return cfg, dictionary, model


def measure(args, device, dtype):
    """Seconds per sentence-configuration of masked beam search, and of importance."""
    from fairseq.sequence_generator import SequenceGenerator

    from fairseq_headprune.modules.masked_multihead_attention import head_layout, set_head_mask

    cfg, dictionary, model = build_model(args.measure_arch, args.vocab, args.heads, device, dtype)
    layout = head_layout(model)
    generator = torch.Generator().manual_seed(1)
    rows = args.batch_size * args.configs_per_batch
    source = torch.randint(dictionary.nspecial, len(dictionary), (rows, args.source_length), generator=generator)
    source[:, -1] = dictionary.eos()
    sample = {"net_input": {"src_tokens": source.to(device),
                            "src_lengths": torch.full((rows,), args.source_length, device=device)}}
    # one random configuration per block of --batch-size sentences, as a sweep batches them
    per_config = {t: (torch.rand(layers, args.configs_per_batch, n, generator=generator) > 0.1)
                  for t, (layers, n) in layout.items()}
    masks = {t: m.repeat_interleave(args.batch_size, dim=1).to(device=device, dtype=dtype)
             for t, m in per_config.items()}
    search = SequenceGenerator([model], dictionary, beam_size=args.beam, max_len_a=0,
                               max_len_b=args.target_length, min_len=args.target_length)

    def decode():
        set_head_mask(model, masks)
        with torch.no_grad():
            search.generate([model], sample)

    target = torch.randint(dictionary.nspecial, len(dictionary), (args.batch_size, args.target_length),
                           generator=generator).to(device)
    teacher = {"src_tokens": sample["net_input"]["src_tokens"][:args.batch_size],
               "src_lengths": sample["net_input"]["src_lengths"][:args.batch_size],
               "prev_output_tokens": target}

    def importance():
        xi = {t: torch.ones(layers, args.batch_size, n, device=device, dtype=dtype, requires_grad=True)
              for t, (layers, n) in layout.items()}
        set_head_mask(model, xi)
        logits = model(**teacher)[0]
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), target.view(-1))
        loss.backward()

    def timed(work, sentences):
        work()  # warm-up
        seconds = []
        for _ in range(args.repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            work()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds) / sentences, seconds

    decode_seconds, decode_runs = timed(decode, rows)
    importance_seconds, importance_runs = timed(importance, args.batch_size)
    set_head_mask(model, None)
    return cfg, {"decode": decode_seconds, "importance": importance_seconds,
                 "decode_runs": decode_runs, "importance_runs": importance_runs}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="transformer_vaswani_wmt_en_fr_big",
                        help="the model planned for (default: the paper's WMT model, 6+6 layers, d=1024)")
    parser.add_argument("--measure-arch", help="the model measured here (default: --arch)")
    parser.add_argument("--vocab", type=int, default=44512,
                        help="joined dictionary size (default: 44512, fairseq's wmt14.en-fr bundle)")
    parser.add_argument("--heads", type=int, default=16, help="heads per attention layer (default: 16)")
    parser.add_argument("--source-length", type=int, default=30, help="source BPE tokens per sentence (default: 30)")
    parser.add_argument("--target-length", type=int, default=33, help="target BPE tokens decoded (default: 33)")
    parser.add_argument("--beam", type=int, default=4, help="beam size (default: 4, as the paper's model)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="sentences per configuration in a batch (default: 64)")
    parser.add_argument("--configs-per-batch", type=int, default=4, help="configurations per batch (default: 4)")
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 8], help="device counts to plan for (default: 1 8)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true", help="half precision (GPU)")
    precision.add_argument("--bf16", action="store_true", help="bfloat16")
    parser.add_argument("--cpu", action="store_true", help="CPU even if a GPU is present")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats, median taken (default: 3)")
    parser.add_argument("--json", metavar="FILE", help="also write the plan and measurements as JSON")
    args = parser.parse_args()
    args.measure_arch = args.measure_arch or args.arch
    for name in ("vocab", "heads", "source_length", "target_length", "beam", "batch_size",
                 "configs_per_batch", "repeats"):
        if getattr(args, name) < 1:
            sys.exit(f"plan_wmt: error: --{name.replace('_', '-')} must be at least 1")
    if min(args.gpus) < 1:
        sys.exit("plan_wmt: error: --gpus must be at least 1")

    from fairseq_headprune.registry import register_components

    register_components()
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from fairseq_headprune import cli

    cli.quiet_libraries()
    for arch in {args.arch, args.measure_arch}:
        if arch not in ARCH_CONFIG_REGISTRY:
            sys.exit(f"plan_wmt: error: unknown fairseq --arch {arch}")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    dtype = torch.float16 if args.fp16 else torch.bfloat16 if args.bf16 else torch.float32
    if args.fp16 and device.type != "cuda":
        sys.exit("plan_wmt: error: --fp16 needs a GPU")
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"cpu ({torch.get_num_threads()} threads)")

    measured_cfg, seconds = measure(args, device, dtype)
    planned_cfg = argparse.Namespace(arch=args.arch, encoder_attention_heads=args.heads,
                                     decoder_attention_heads=args.heads)
    ARCH_CONFIG_REGISTRY[args.arch](planned_cfg)
    lengths = (args.source_length, args.target_length, args.beam)
    scale = (flops_per_sentence(planned_cfg, args.vocab, *lengths)
             / flops_per_sentence(measured_cfg, args.vocab, *lengths))
    print(f"device: {device_name}, {str(dtype).replace('torch.', '')}, torch {torch.__version__}")
    print(f"measured {args.measure_arch} (random weights, vocab {args.vocab}, {args.heads} heads): "
          f"source {args.source_length} tokens, {args.target_length} target tokens forced, beam {args.beam}, "
          f"{args.configs_per_batch} configurations x {args.batch_size} sentences per batch")
    print(f"  masked beam search: {1000 * seconds['decode']:.2f} ms per sentence and configuration "
          f"({args.target_length / seconds['decode']:.0f} target tokens/s)")
    print(f"  importance (forward + backward to the mask): {1000 * seconds['importance']:.2f} ms per sentence")
    if args.measure_arch != args.arch:
        print(f"scaled to {args.arch} by its FLOPs per sentence: x{scale:.2f}")
    print(f"\nexpected wall time of the WMT studies ({args.arch}) on {device_name}, hours:")
    unit = "GPU" if device.type == "cuda" else "CPU"
    header = f"{'study':58s} {'configs':>7s} {'sentences':>9s} " + " ".join(
        f"{f'{n} {unit}' + ('s' if n > 1 else ''):>8s}" for n in args.gpus)
    print(header)
    rows = []
    for study, configs, sentences, kind in wmt_studies(planned_cfg.encoder_layers, args.heads):
        hours = configs * sentences * seconds[kind] * scale / 3600
        cells = {n: hours / n for n in args.gpus}
        rows.append({"study": study, "configurations": configs, "sentences": sentences, "kind": kind,
                     "hours": {str(n): h for n, h in cells.items()}})
        print(f"{study:58s} {configs:7d} {sentences:9d} " + " ".join(f"{cells[n]:8.2f}" for n in args.gpus))
    total = {n: sum(r["hours"][str(n)] for r in rows) for n in args.gpus}
    print(f"{'all of the above':58s} {'':7s} {'':9s} " + " ".join(f"{total[n]:8.2f}" for n in args.gpus))
    print("assumptions: perfect scaling over GPUs (configurations dealt round robin), model loading and "
          "BLEU/significance left out, every sentence decoded to the forced length")
    if args.json:
        from fairseq_headprune.study.output.files import write_json

        write_json({"device": device_name, "dtype": str(dtype), "torch": torch.__version__,
                    "arch": args.arch, "measure_arch": args.measure_arch, "flops_scale": scale,
                    "settings": {k: v for k, v in vars(args).items() if k != "json"},
                    "seconds_per_sentence": seconds, "studies": rows, "total_hours": total},
                   args.json, indent=1)
        print(f"wrote\t{args.json}")


if __name__ == "__main__":
    main()
