"""Timing in deployment: each system (one model in one engine) in a process of its own, passes rotated."""
