"""Benchmark the proxy's overhead against a mocked SGLang on loopback (same as ``openclaw-rl bench``).

    python scripts/bench_proxy.py [--quick] [--out results.json] [--plot bench.png]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from openclaw_rl.bench.proxy_bench import main  # noqa: E402

sys.exit(main())
