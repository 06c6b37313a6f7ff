"""Michel et al. (2019)'s own figures, as its text and tables state them, and the values that would contradict
each sentence the findings test (``findings``): the paper's counts, its largest losses, its correlation and its
speed-up, each with the source of its margin beside it.
"""

from fairseq_headprune.study.output.finding import Claim

PAPER = {
    "single": ("8 of 96 Enc-Enc heads change the BLEU significantly when masked alone, half of them for the better; "
               "largest drop −0.53 BLEU (Table 1)",
               "most of the 144 heads can be masked alone with little change in accuracy (Figure 1(b))"),
    "all_but_one": ("\"for most layers, one head is indeed sufficient\": every layer within −1.55 BLEU but Enc-Dec "
                    "layer 6: −13.56 (Table 2)",
                    "every layer within −0.96% accuracy with one head kept, \"none of these results are statistically "
                    "significant\" (Table 3)"),
    "selected": ("no significant change for 50% of the layers with the head chosen on held-out data",
                 "no significant change for 100% of the layers with the head chosen on held-out data"),
    "cross_domain": ("\"a positive, > 0.5 correlation\" (newstest2013 vs MTNT)",
                     "\"a positive, > 0.5 correlation\" (MNLI matched vs mismatched)"),
    "pruned_share": ("20% of the heads pruned by importance with no noticeable loss",
                     "40% of the heads pruned by importance with no noticeable loss"),
}
PRUNED_SHARE = (20, 40)  # % of the heads the papers prune with no noticeable loss (WMT, BERT)
# the papers' counts behind the shares, and the share that contradicts each sentence (the paper's own count lies
# clear of it): Table 1's 8 of 96 Enc-Enc heads changing significantly, contradicted by three times that share (WMT;
# BERT: "most" of 144 heads do not change, contradicted by a majority that does); appendix A's layers without a
# significant change with the head chosen on held-out data, 9 of 18 and 12 of 12, contradicted by half that share;
# Table 3's none of 12 BERT layers significant, contradicted by a quarter of them
SINGLE_COUNT = ((8, 96), None)
SINGLE_CONTRADICTION = (3 * 8 / 96, 0.5)
SELECTED_COUNT = ((9, 18), (12, 12))
TABLE3_SIGNIFICANT = (0, 12)
TABLE3_CONTRADICTION = 0.25
# a layer's loss with its best head kept (WMT, BERT), the largest of the paper's ordinary layers, and the WMT
# exception; a loss twice as large contradicts "one head is sufficient"
ALL_BUT_ONE = (-1.55, -0.96)
ENC_DEC_LAST = -13.56
# "no noticeable loss": a loss as large as the paper's largest single-head drop (Table 1, WMT: 0.53 BLEU, significant)
# or its largest one-head layer loss (Table 3, BERT: 0.96 points, not significant) is noticeable
NOTICEABLE = (0.53, 0.96)
CORRELATION = 0.5  # "a positive, > 0.5 correlation"
SPEEDUP = 1.175  # "up to 17.5% at higher batch sizes"; "this difference vanishes for smaller batch sizes"
SPEED_UNITS = "timing rounds"
SENTENCES = "test examples"


def share_claim(count, side: str, contradiction: float) -> Claim:
    """A share the paper counted (``count``: successes, units), contradicted at ``contradiction``."""
    figure = count[0] / count[1]
    return Claim(figure, side, margin=abs(contradiction - figure))
