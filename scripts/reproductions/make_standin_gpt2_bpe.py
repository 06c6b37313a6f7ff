#!/usr/bin/env python
"""Learn a small byte-level BPE in GPT-2's file format (encoder.json, vocab.bpe) from text files.

The released RoBERTa models use GPT-2's BPE (50k merges, downloaded). The
offline stand-in bundle of scripts/reproductions/make_standin_roberta_bundle.sh needs files
of the same format that fairseq's own ``gpt2_bpe_utils.Encoder`` reads, at
tiny size: the 256 byte symbols, then MERGES merges learned greedily (the
most frequent adjacent pair first, Sennrich et al. 2016) on the words
fairseq's pre-tokenizing pattern splits the text into.
"""

import argparse
import collections
import json
import os
import sys


def learn_merges(words: collections.Counter, merges: int):
    """The ``merges`` most frequent pair merges, in order, over ``words`` (tuples of symbols -> count)."""
    learned = []
    vocabulary = dict(words)
    for _ in range(merges):
        pairs = collections.Counter()
        for word, count in vocabulary.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = max(pairs.items(), key=lambda item: (item[1], item[0]))[0]  # ties: the larger pair, fixed
        learned.append(best)
        merged = {}
        for word, count in vocabulary.items():
            symbols, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    symbols.append(word[i] + word[i + 1])
                    i += 2
                else:
                    symbols.append(word[i])
                    i += 1
            merged[tuple(symbols)] = merged.get(tuple(symbols), 0) + count
        vocabulary = merged
    return learned


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("texts", nargs="+", help="text files to learn from")
    parser.add_argument("--merges", type=int, default=300, help="merges to learn (default 300)")
    parser.add_argument("--out-dir", required=True, help="directory for encoder.json and vocab.bpe")
    args = parser.parse_args(argv)
    if args.merges < 0:
        parser.error(f"--merges must be >= 0, got {args.merges}")

    from fairseq.data.encoders.gpt2_bpe_utils import Encoder, bytes_to_unicode

    byte_symbols = bytes_to_unicode()
    pattern = Encoder({}, []).pat  # fairseq's pre-tokenization
    words = collections.Counter()
    for path in args.texts:
        with open(path, encoding="utf-8") as stream:
            for line in stream:
                for token in pattern.findall(line):
                    words[tuple(byte_symbols[b] for b in token.encode("utf-8"))] += 1
    merges = learn_merges(words, args.merges)
    symbols = [byte_symbols[b] for b in range(256)] + ["".join(pair) for pair in merges]
    encoder = {symbol: index for index, symbol in enumerate(dict.fromkeys(symbols))}
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "encoder.json"), "w", encoding="utf-8") as stream:
        json.dump(encoder, stream, ensure_ascii=False)
    with open(os.path.join(args.out_dir, "vocab.bpe"), "w", encoding="utf-8") as stream:
        stream.write("#version: 0.2\n")
        stream.writelines(f"{first} {second}\n" for first, second in merges)
    print(f"{len(merges)} merges, {len(encoder)} symbols: {args.out_dir}/encoder.json, vocab.bpe")
    return 0


if __name__ == "__main__":
    sys.exit(main())
