"""The read path: per-worker prefix-hit estimates from the index (the hybrid rule)."""
