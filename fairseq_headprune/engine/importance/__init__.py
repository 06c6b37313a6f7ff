"""Head importance on a loaded model: the criterion's passes, per-example ξ, the loss under a mask."""
