"""Fine-tuning with the pruned units held: its settings, the stop rule, the recovery curve and its memory."""
