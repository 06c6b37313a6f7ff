"""The report's section on structures/ (scripts/studies/compare_structures.sh): heads, FFN neurons or both.

BLEU against the share of the attention and FFN layers' FLOPs removed, the
shrunk models' decoding speed in fairseq and CTranslate2, and the fine-tune,
read from the result files (``study`` is the report's view of the directory).
"""

import os
import re

from fairseq_headprune.study.compression.speed import SpeedRow


def section_structures(study) -> str:
    """Heads, FFN neurons or both against the share of the layers' FLOPs removed
    (scripts/studies/compare_structures.sh)."""
    parts = ["## Heads, FFN neurons, or both: BLEU per share of the layers' FLOPs removed\n\n",
             "Kwon et al.'s (2022) Fisher search over heads only, FFN neurons only, and both together, each "
             "untuned and with mask tuning (least squares on validation sentences, a fit kept only if it lowers "
             "the loss on held-aside ones); x: % of the attention and FFN layers' FLOPs per token removed. "
             "Bold: p < 0.01 against the unpruned model (paired bootstrap).\n\n"]
    for structure in ("heads", "ffn", "joint"):
        if study.exists("structures", structure, "prune_curves.md"):
            parts.append(study.table(f"structures/{structure}/prune_curves.md"))
    levels = sorted(d for d in os.listdir(study.path("structures")) if d.startswith("level-"))
    for level in levels:
        rows = []
        for structure in ("heads", "ffn", "joint"):
            if study.exists("structures", level, structure, "speed.json"):
                payload = study.json("structures", level, structure, "speed.json")
                rows += [(structure, payload, SpeedRow.from_dict(r)) for r in payload["rows"]]
        if not rows:
            continue
        payload = rows[0][1]
        parts.append(f"Decoding speed with {level.split('-', 1)[1]}% of the layers' FLOPs removed (the tuned search's "
                     f"mask, shrunk), beam {payload['beam']}, {payload['threads']} threads on {payload['device']}, "
                     f"torch {payload['torch']}, CTranslate2 {payload['ctranslate2']}; sentences/s (median of the "
                     "interleaved repeats):\n\n")
        parts.append("| structure | batch | system | sent/s | vs fairseq unpruned | vs unpruned, like for like "
                     "| BLEU | same hypotheses |\n|---|---:|---|---:|---:|---:|---:|---:|\n")
        for structure, _, r in rows:
            vs_ct2 = r.speedup_like_for_like
            same = "" if r.same_hypotheses is None else f"{r.same_hypotheses}/{r.sentences}"
            parts.append(f"| {structure} | {r.batch_size} | {r.system} | {r.sentences_per_second:.1f} | "
                         f"{r.speedup_vs_fairseq_unpruned:.2f}x | {'' if vs_ct2 is None else f'{vs_ct2:.2f}x'} | "
                         f"{r.bleu:.2f} | {same} |\n")
        parts.append("\n")
    for directory in sorted(d for d in os.listdir(study.path("structures")) if d.startswith("finetune-")):
        if study.exists("structures", directory, "report.md"):
            body = study.text("structures", directory, "report.md").split("\n", 1)[-1].strip()
            body = re.sub(r"^(#{2,6}) ", r"\1## ", body, flags=re.M)  # its sections under this one
            parts.append(f"The joint search at {directory.split('-', 1)[1]}% of the FLOPs removed, tuned, then "
                         f"fine-tuned with the structure held (`compress`):\n\n{body}\n\n")
    return "".join(parts) + study.command("structures")
