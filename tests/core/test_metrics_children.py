"""``ProxyMetrics``' metrics keep their labelled children (``metrics._KeptChildren``): the counts on
``/metrics`` are the ones ``labels()`` would give, per label value, and a removed child is not reused."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from openclaw_rl.metrics import ProxyMetrics


def values(m: ProxyMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_each_label_value_counts_on_its_own_child():
    m = ProxyMetrics()
    for kind in ("main", "main", "side", "main"):
        m.turns.labels(kind).inc()
    m.requests.labels("/v1/chat/completions", "200").inc()
    m.requests.labels("/v1/chat/completions", "400").inc(2)
    m.requests.labels("/healthz", "200").inc()
    m.latency.labels("/healthz").observe(0.003)
    assert m.turns.labels("main") is m.turns.labels("main")
    assert values(m, "openclaw_turns_total") == {(("type", "main"),): 3.0, (("type", "side"),): 1.0}
    assert values(m, "openclaw_requests_total") == {
        (("code", "200"), ("route", "/v1/chat/completions")): 1.0,
        (("code", "400"), ("route", "/v1/chat/completions")): 2.0,
        (("code", "200"), ("route", "/healthz")): 1.0}
    assert values(m, "openclaw_request_seconds_count") == {(("route", "/healthz"),): 1.0}


def test_a_removed_child_is_not_reused():
    m = ProxyMetrics()
    m.sessions.labels("tracked").set(5)
    m.sessions.remove("tracked")
    m.sessions.labels("tracked").set(7)
    assert values(m, "openclaw_sessions") == {(("state", "tracked"),): 7.0}
    m.sessions.clear()
    m.sessions.labels("idle").inc()
    assert values(m, "openclaw_sessions") == {(("state", "idle"),): 1.0}


def test_a_bound_children_map_counts_where_labels_does_and_follows_clear():
    """A hot path binds ``metric.children`` once (server's middleware and judge votes, the writer): its
    children are ``labels()``'s own, and after ``remove``/``clear`` it hands out the new series, not the
    removed child (the map is emptied in place, never replaced)."""
    m = ProxyMetrics()
    votes, requests = m.judge_votes.children, m.requests.children
    votes[("ok",)].inc()
    m.judge_votes.labels("ok").inc()
    votes[("failed",)].inc()
    requests[("/healthz", "200")].inc(3)
    assert votes[("ok",)] is m.judge_votes.labels("ok")
    assert values(m, "openclaw_judge_votes_total") == {(("outcome", "ok"),): 2.0, (("outcome", "failed"),): 1.0}
    assert values(m, "openclaw_requests_total") == {(("code", "200"), ("route", "/healthz")): 3.0}
    removed = votes[("ok",)]
    m.judge_votes.remove("ok")
    votes[("ok",)].inc()
    assert votes[("ok",)] is not removed
    m.judge_votes.clear()
    votes[("unparsable",)].inc()
    assert values(m, "openclaw_judge_votes_total") == {(("outcome", "unparsable"),): 1.0}
    assert m.judge_votes.children is votes
