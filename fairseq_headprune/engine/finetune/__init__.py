"""Fine-tuning with the pruned units held: fairseq-train on the plugin's task, on one process or several, its resume
points and its memory plan."""
