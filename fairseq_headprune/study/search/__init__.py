"""Kwon et al. (2022) and learned gates: budgeted mask search and rearrangement, what a mask costs, mask tuning by
least squares, hard-concrete gates, and their settings."""
