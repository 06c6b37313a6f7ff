"""``compress`` and deployment: its target and settings, beam search's options, the compute type chosen by
measurement, the vocabulary map, and its report."""
