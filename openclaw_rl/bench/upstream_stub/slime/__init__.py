"""Benchmark stub of Slime: only what upstream OpenClaw-RL's proxy imports (see the parent package)."""
