"""Kwon et al.'s search on a loaded model: the masks and tunings a study stores, mask tuning layer by layer, what a
model costs by its shape, and per-layer latency in fairseq and CTranslate2."""
