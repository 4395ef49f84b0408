"""``openclaw-rl bench``'s targets, metric names and report: the table it prints, the PASS/MISS verdicts and
its plot. Stage: benchmark output (``proxy_bench.py`` measures; this says what the measurements mean).
"""

from __future__ import annotations

from typing import Any

# History buckets (prompt tokens). The system prompt and 12 tools alone are ~1.9K tiny-tokenizer
# tokens, so the smallest histories are ~2-3K; turns between 5.6K and 6.4K fall in no bucket.
BUCKETS = (("2k", 0, 3400), ("4k", 3400, 5600), ("8k", 6400, 1 << 30))
# What the bench checks is the envelope the README and docs/performance.md state for a quiet 2-core
# machine (so PASS means "as documented"): CPU per turn 2.4-8 ms for plain replies up to ~8K-token
# histories, 3.5-8.6 ms added at c=1, added TTFB 2.6-6.8 ms, ≥ 150 turns/s at c=16. Issue #12's stricter
# goals (≤ 5 ms CPU, +≤ 3 ms p50 at c=1) are tracked in docs/performance.md, where they are met only at ~1K.
# Latency and throughput depend on the load: the bench prints the load average next to the table.
TARGETS = (  # metric, op, bound, meaning
    ("cpu_ms_per_turn_4k", "<=", 8.0, "proxy CPU per turn, ~4K-token history"),
    ("a_added_p50_ms", "<=", 9.0, "added latency p50, zero-latency mock, c=1"),
    ("a_added_p99_ms", "<=", 25.0, "added latency p99, zero-latency mock, c=1"),
    ("b_turns_per_s", ">=", 120.0, "turns/s through the proxy, zero-latency mock, c=16"),
    ("c_added_p50_ms", "<=", 10.0, "added latency p50, model-like mock, c=16"),
    ("stream_ttft_added_p50_ms", "<=", 8.0, "streaming TTFT, proxy - direct (p50), c=1"),
    ("cpu_growth_8k_over_2k", "<=", 1.5, "CPU/turn 8K bucket / 2K bucket (equal new tokens)"),
    ("idle_session_net_kb", "<=", 64.0, "RSS per idle session beyond its token ids"),
)
_PER_CONFIG = ("added_p50_ms", "added_p95_ms", "added_p99_ms", "proxy_p50_ms", "proxy_p99_ms", "direct_p50_ms",
               "direct_p99_ms", "turns_per_s", "direct_turns_per_s", "proxy_over_direct", "cpu_ms_per_turn", "turns",
               "errors")
METRIC_KEYS = (*(f"{c}_{k}" for c in "abc" for k in _PER_CONFIG),
               *(f"stream_ttft_{k}" for k in _PER_CONFIG[:7]), "stream_pairs", "b_floor_turns_per_s", "b_proxy_over_floor",
               *(f"cpu_ms_per_turn_{b}" for b, _, _ in BUCKETS), *(f"history_tokens_{b}" for b, _, _ in BUCKETS),
               "cpu_growth_8k_over_2k", "cpu_ms_per_1k_history_tokens", "rss_baseline_kb", "idle_sessions",
               "idle_session_kb", "idle_session_net_kb", "live_sessions", "live_session_kb", "live_session_net_kb")

def verdicts(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"metric": key, "value": (v := metrics.get(key)), "target": f"{op} {bound:g}", "meaning": meaning,
             "pass": None if v is None else (v <= bound if op == "<=" else v >= bound)}
            for key, op, bound, meaning in TARGETS]


def print_report(results: dict[str, Any]) -> None:
    m, w = results["metrics"], (20, 24, 11, 11, 9, 11, 12)
    rows = [("config", "added p50/p95/p99 ms", "proxy p50", "direct p50", "turns/s", "direct t/s", "CPU ms/turn")]
    for tag, name in (("a", "a zero-lat c=1"), ("b", "b zero-lat c=16"), ("c", "c model-like c=16"),
                      ("stream_ttft", "TTFT model-like c=1")):
        rows.append((name, "/".join(str(m[f"{tag}_added_p{q}_ms"]) for q in (50, 95, 99)),
                     *(str(m.get(f"{tag}_{k}", "-")) for k in ("proxy_p50_ms", "direct_p50_ms", "turns_per_s",
                                                              "direct_turns_per_s", "cpu_ms_per_turn"))))
    print("\n".join(row[0].ljust(w[0]) + "".join(v.rjust(n) for v, n in zip(row[1:], w[1:])) for row in rows))
    print("throughput proxy / direct-to-mock: " + ", ".join(f"{t} {m.get(f'{t}_proxy_over_direct')}" for t in "abc")
          + f"; proxy / floor at c=16 (the same bytes from a lean replay server, {m.get('b_floor_turns_per_s')} "
          f"turns/s): {m.get('b_proxy_over_floor')}")
    print("CPU ms/turn by history: " + ", ".join(f"{b}: {m[f'cpu_ms_per_turn_{b}']} (~{m[f'history_tokens_{b}']} tok)"
                                                 for b, _, _ in BUCKETS)
          + f"; fit: {m['cpu_ms_per_1k_history_tokens']} ms per 1K history tokens")
    print(f"memory: idle session {m['idle_session_kb']} KB ({m['idle_session_net_kb']} KB net of token ids), "
          f"live session {m['live_session_kb']} KB ({m['live_session_net_kb']} KB net)\n")
    for row in [{"metric": "target", "value": "value", "target": "goal", "pass": "", "meaning": "meaning"},
                *results["targets"]]:
        flag = {"": "", None: "n/a", True: "PASS", False: "MISS"}[row["pass"]]
        print(f"{row['metric']:<26}{row['value']!s:>10}  {row['target']:<9}{flag:<6}{row['meaning']}")


def plot(results: dict[str, Any], path: str) -> None:
    """Added-latency percentiles per configuration, and CPU per turn per history bucket."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = results["metrics"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    tags = [("a", "a: zero, c=1"), ("b", "b: zero, c=16"), ("c", "c: model-like, c=16"), ("stream_ttft", "TTFT, c=1")]
    for j, q in enumerate((50, 95, 99)):
        ax1.bar([i + (j - 1) * 0.27 for i in range(len(tags))], [m[f"{t}_added_p{q}_ms"] or 0 for t, _ in tags],
                width=0.27, label=f"p{q}")
    ax1.set_xticks(range(len(tags)), [name for _, name in tags])
    ax1.set_ylabel("latency added by the proxy (ms)")
    ax2.bar([f"~{m[f'history_tokens_{b}'] or 0} tok" for b, _, _ in BUCKETS],
            [m[f"cpu_ms_per_turn_{b}"] or 0 for b, _, _ in BUCKETS])
    ax2.axhline(5.0, color="red", linestyle="--", label="target at 4K: 5 ms")
    ax2.set_ylabel("proxy CPU per turn (ms), by history size")
    for ax in (ax1, ax2):
        ax.legend()
    fig.suptitle("openclaw-rl proxy overhead (loopback, scripted SGLang, judge m=3)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
