"""Traffic generators for load tests and benchmarks (loopback only, bounded in count and time)."""
