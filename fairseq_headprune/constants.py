"""Names and defaults shared across layers: one source for each.

Plain values only (no fairseq, no torch), so every layer can import them.
"""

# attention types, in the paper's order; a model's layout holds those it has
ATTENTION_TYPES = ("enc-enc", "enc-dec", "dec-dec")
# the authors' one-letter names: E(ncoder), A (encoder-decoder Attention), D(ecoder)
TYPE_LETTERS = {"enc-enc": "E", "enc-dec": "A", "dec-dec": "D"}
# titles in tables and figures, as the paper writes them
TYPE_TITLES = {"enc-enc": "Enc-Enc", "enc-dec": "Enc-Dec", "dec-dec": "Dec-Dec"}
# the spec of the empty mask
NO_MASK_SPEC = "none"

# importance I_h = E_x |dL(x)/dxi_h|: the unit x is a sentence (the paper), a
# target token (the authors' code) or a batch
GRANULARITIES = ("sentence", "token", "batch")
DEFAULT_GRANULARITY = "sentence"
# the loss L(x) differentiated for importance: plain cross-entropy (NLL) by
# default, as the authors' prune_wmt.sh, which runs prune.py with fairseq
# 0.6's default criterion (cross_entropy); label smoothing stays selectable
IMPORTANCE_LOSSES = ("nll", "label_smoothed")
# gradient: I_h = E_x |dL(x)/dxi_h| (Michel et al.); fisher: F_h = E_x (dL(x)/dxi_h)^2, the mask's
# diagonal Fisher information (Kwon et al. 2022)
IMPORTANCE_METHODS = ("gradient", "fisher")
DEFAULT_IMPORTANCE_METHOD = "gradient"
DEFAULT_IMPORTANCE_LOSS = "nll"
DEFAULT_LABEL_SMOOTHING = 0.1

# significance tests: seed as sacreBLEU's (SACREBLEU_SEED's default), level as the paper's
# paired tests for BLEU (corpus-level: resampling) and for per-example correctness (classification)
BLEU_TESTS = ("bootstrap", "compare-mt", "sacrebleu-bs", "sacrebleu-ar")
CORRECTNESS_TESTS = ("t-test", "mcnemar")
SIGNIFICANCE_TESTS = BLEU_TESTS + CORRECTNESS_TESTS
DEFAULT_SIGNIFICANCE_SEED = 12345
DEFAULT_RESAMPLES = 1000
DEFAULT_ALPHA = 0.01

# seeds of the random pruning orders and budgets, and of the demo corpus
DEFAULT_PRUNING_SEED = 1
DEFAULT_CORPUS_SEED = 1

# pruning curves: levels every DEFAULT_STEP_PERCENT % of the heads up to DEFAULT_MAX_PERCENT %
# (the paper's 10% steps); random orders and budgets are drawn DEFAULT_DRAWS times
DEFAULT_STEP_PERCENT = 10.0
DEFAULT_MAX_PERCENT = 90.0
DEFAULT_DRAWS = 3
# masked configurations translated together in one batch (the CPU's; on a GPU chosen for the device)
DEFAULT_CONFIGS_PER_BATCH = 4
FAIRSEQ_GENERATE_MAX_TOKENS = 12000  # fairseq-generate's batching when neither --batch-size nor --max-tokens is given

# pruning: which heads a curve may prune (all types together, or one), and in which order
SCOPES = ("all",) + ATTENTION_TYPES
ORDERS = ("importance", "iterative", "ablation", "random", "fisher", "fisher-rearranged", "gates")
# what a budgeted mask search (Kwon et al. 2022) counts: heads kept, attention FLOPs per token,
# or latency from a table measured per layer on the device; decoding-flops: a translation model's FLOPs per
# sentence in beam search (encoder once per source token, decoder once per step and beam row)
COST_KINDS = ("heads", "flops", "decoding-flops", "latency")
# what runs the layers a latency table times: fairseq (each layer alone) or CTranslate2 (the exported model)
FAIRSEQ_ENGINE = "fairseq"
CTRANSLATE2_ENGINE = "ctranslate2"
LATENCY_ENGINES = (FAIRSEQ_ENGINE, CTRANSLATE2_ENGINE)
# the attention kernel a timed fairseq system runs: torch's fused one in every layer, or fairseq's own unfused path
FUSED_ATTENTION, FAIRSEQ_ATTENTION = "fused", "fairseq"
# CTranslate2's weight types (its --quantization); which the device computes is checked when exporting
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16")
# what a search or a pruning curve prunes: attention heads, FFN neurons, or both chosen together (Kwon et al. 2022)
PRUNED_STRUCTURES = ("heads", "ffn", "joint")
# a pruning curve's x-axis: the share of its units pruned (heads or neurons), or of the layers' FLOPs removed
X_AXES = ("units", "flops")
# the orders of FFN-neuron curves (by score, at random, or searched) and of joint curves (searched)
STRUCTURE_ORDERS = {"ffn": ("importance", "random", "fisher"), "joint": ("fisher", "fisher-rearranged")}
DEFAULT_SEQUENCE_LENGTH = 32  # attended positions assumed by the FLOPs cost and the latency table
# mask tuning by least squares: sentences of each tuning split, the largest scale, the largest condition number
DEFAULT_TUNE_LIMIT = 2000
DEFAULT_SCALE_BOUND = 10.0
DEFAULT_MAX_CONDITION = 1e8
DEFAULT_HELD_ASIDE = 0.2  # share of the tuning batches that decides whether each layer's fit is kept
TUNE_LAYERS = ("pruned", "downstream")  # which sub-layers mask tuning fits
DEFAULT_TUNE_LAYERS = "downstream"
# ablation studies of Michel et al. section 3
ABLATION_MODES = ("single", "all-but-one", "cross-domain")

# model families the studies take, from the task a checkpoint was trained with:
# encoder-decoder translation (BLEU), encoder-only classifiers (accuracy or Matthews
# correlation), decoder-only language models (perplexity)
TRANSLATION_FAMILY = "translation"
CLASSIFIER_FAMILY = "classifier"
LANGUAGE_MODEL_FAMILY = "language_model"
MODEL_FAMILIES = (TRANSLATION_FAMILY, CLASSIFIER_FAMILY, LANGUAGE_MODEL_FAMILY)
# the plugin's registered tasks, one per family (tasks/*.py register them under these names)
TRANSLATION_TASK = "fairseq-headprune"
CLASSIFIER_TASK = "headprune_sentence_prediction"
LANGUAGE_MODEL_TASK = "headprune_language_modeling"
# FFN blocks whose hidden units (neurons) can be masked: the encoder's and the decoder's,
# named in specs as E and D (--ffn-mask "E:2:1-200 D:6:keep=1-128")
FFN_TYPES = ("enc-ffn", "dec-ffn")
FFN_TYPE_LETTERS = {"enc-ffn": "E", "dec-ffn": "D"}
# what importance scores: attention heads (always) and, on request, FFN neurons (Kwon et al. 2022)
STRUCTURES = ("heads", "ffn")
