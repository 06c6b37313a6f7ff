"""Budhraja et al. (2020), "On the weak link between importance and prunability of attention heads": their
protocol (every pruned configuration fine-tuned, then scored), its records and recovery curves."""
