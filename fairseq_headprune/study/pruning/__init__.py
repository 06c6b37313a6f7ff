"""Pruning curves (Michel et al. sections 4.2 and 5): orders, steps and levels, FFN-neuron and joint curves, the
comparison of pruning methods, and the settings of ``prune`` and ``dynamics``."""
