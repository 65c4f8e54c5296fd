"""Evaluation: per-class accuracy under named attacks, per-class measures, and diagnostics of a checkpoint."""
