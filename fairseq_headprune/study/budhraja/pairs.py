"""The configurations Budhraja et al. set side by side, tested against each other directly.

Table 5 compares whole layers pruned at the same K: the middle K against K
split between the top and the bottom, and the top K against the bottom K;
Table 6 the odd layers against the top and the bottom half. Each side is one
fine-tune, tested against the unpruned model; their difference is better
judged by the paired test of the two against each other on the same
examples (``prune`` runs it on their per-sentence or per-example statistics
and records it in the first's ``paired``), which sees the examples the two
share and does not add the two tests' noise.
"""

from typing import Dict, List, Optional, Tuple

from fairseq_headprune.study.budhraja.records import FinetuneRecord

# Table 5's pairs at the same K: (first, second), judged as first minus second
TABLE5_PAIRS = (("middle", "top+bottom"), ("top", "bottom"))


def split_label(label: str) -> Tuple[str, str, Optional[int]]:
    """``enc-enc:middle:2`` -> (``enc-enc:``, ``middle``, 2); ``odd`` -> ("", ``odd``, None)."""
    parts = label.split(":")
    count = int(parts[-1]) if parts[-1].isdigit() else None
    name_at = -2 if count is not None else -1
    if len(parts) < -name_at:
        return "", label, None
    return ":".join(parts[:name_at]) + (":" if len(parts) > -name_at else ""), parts[name_at], count


def within_pairs(records: List[FinetuneRecord]) -> List[Tuple[FinetuneRecord, FinetuneRecord]]:
    """(first, second) for every pair of whole-layer configurations the paper compares that both ran: Table 5's
    middle:K with top+bottom:K and top:K with bottom:K (of one attention type, or of all), Table 6's odd with the
    top and the bottom half (the configurations recorded as Table 6's)."""
    layers: Dict[str, FinetuneRecord] = {r.label: r for r in records if r.kind == "layers"}
    pairs = []
    for label, record in layers.items():
        prefix, name, count = split_label(label)
        for first, second in TABLE5_PAIRS:
            partner = layers.get(f"{prefix}{second}:{count}") if name == first and count is not None else None
            if partner is not None:
                pairs.append((record, partner))
        if name == "odd" and 6 in record.tables:
            for half in layers.values():
                half_prefix, half_name, _ = split_label(half.label)
                if 6 in half.tables and half_prefix == prefix and half_name in ("top", "bottom"):
                    pairs.append((record, half))
    return pairs
