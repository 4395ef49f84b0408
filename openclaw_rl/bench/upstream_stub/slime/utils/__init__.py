"""Benchmark stub of ``slime.utils``."""
