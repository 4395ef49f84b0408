"""`openclaw-rl bench` refuses what it cannot measure, before it starts anything."""

from __future__ import annotations

import pytest

from openclaw_rl import cli


@pytest.mark.parametrize(("args", "message"), [
    (["--stream-modes", "stream"], "unknown stream mode stream: choose from cumulative, incremental"),
    (["--stream-modes", "incremental,incremental,"], None),  # once each; a trailing comma is fine
    (["--proxy-env", "OPENCLAW_RL_JSON"], "'OPENCLAW_RL_JSON' is not KEY=VALUE"),
])
def test_stream_cost_options_are_checked(args, message, capsys, monkeypatch, tmp_path):
    """An unknown mode used to run SGLang's cumulative mode and label the results with the unknown name."""
    from openclaw_rl.bench import proxy_bench

    ran: list[tuple[str, ...]] = []
    monkeypatch.chdir(tmp_path)  # `--out` defaults to runs/bench/results.json: never the checkout's
    monkeypatch.setattr(cli, "setup_logging", lambda *args: None)  # leave the test process's logging alone
    monkeypatch.setattr(proxy_bench.mock, "ensure_tokenizer", lambda: "tok")
    monkeypatch.setattr("openclaw_rl.bench.stream_cost.run_stream_cost", lambda *a, **kw: ran.append(kw["modes"]) or {})
    monkeypatch.setattr("openclaw_rl.bench.stream_cost.print_stream_cost", lambda results: None)
    if message is None:
        assert cli.main(["bench", "--stream-cost", *args]) == 0 and ran == [("incremental",)]
        return
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--stream-cost", *args])
    assert exc.value.code == 2 and message in capsys.readouterr().err and not ran
