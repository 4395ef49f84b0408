"""The dashboard in a real browser: headless Chromium (the system's package) driven by Playwright.

One short `local --simulate` run in OPD mode (tiny model, batches of 4, stopped at step 2, simulated replies,
plus one session of a second API key) leaves a spool directory and a metrics.jsonl; the dashboard serves
them (``openclaw-rl dashboard``'s app) and the browser must show, for the first key: the training curves
and the learning curve, the drops by reason, the sessions, a trained turn with its judge votes, hint and
per-token teacher advantage, and a dropped turn with its reason; for the second key, its own session and
nothing of the first's. The page must fit a phone's width and break no Content-Security-Policy rule.
Screenshots go to ``$OPENCLAW_DASHBOARD_SCREENSHOTS`` (docs/images uses them) or the test's tmp dir.
Skips, saying why, without Chromium (``scripts/setup.sh`` installs it as root) or Playwright.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from openclaw_rl.dashboard.journal import read_journal
from openclaw_rl.servers import free_port

KEYS = ["x", "other-key"]  # "x": the simulated users' key (simulate.run_simulation's default)


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium on PATH (scripts/setup.sh installs it as root: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dir):
    from openclaw_rl.embedded.local import LocalConfig, run_local
    from openclaw_rl.embedded.simulate import drive_simulation

    out = tmp_path_factory.mktemp("dashboard-run")

    def users(url, stop, result):
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                       json={"messages": [{"role": "user", "content": "Can you help me plan a trip to Rome?"}]},
                       headers={"Authorization": f"Bearer {KEYS[1]}", "X-Session-Id": "other-session",
                                "X-Session-Done": "true"})
        assert r.status_code == 200, r.text
        # more than 2 batches need: OPD drops the turns without a hint (how many depends on what the tiny
        # model samples), and the run stops at its second step
        drive_simulation(url, stop, result, interactions=64, concurrency=4, seed=0, window=8)

    saved = os.environ.get("OPENCLAW_RL_CACHE")
    os.environ["OPENCLAW_RL_CACHE"] = str(tiny_model_dir.parent)
    try:
        report = run_local(LocalConfig(mode="opd", port=free_port(), out_dir=str(out), rollout_batch_size=4,
                                       max_steps=2, api_keys=KEYS), progress=False, users=users)
    finally:
        if saved is None:
            os.environ.pop("OPENCLAW_RL_CACHE")
        else:
            os.environ["OPENCLAW_RL_CACHE"] = saved
    assert report.steps == 2, f"the simulated users ended after {report.steps} steps"
    return out


@pytest.fixture(scope="module")
def dashboard(run_dir, tokenizer):
    from openclaw_rl.dashboard.command import standalone_app
    from openclaw_rl.servers import BackgroundServer

    server = BackgroundServer(standalone_app(run_dir / "spool", keys=KEYS, tokenizer=tokenizer)).start()
    yield server.url
    server.stop()


def shots() -> Path | None:
    where = os.environ.get("OPENCLAW_DASHBOARD_SCREENSHOTS")
    return Path(where) if where else None


def open_page(browser, url: str, key: str, problems: list[str]):
    page = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=1)  # a phone
    page.on("console", lambda m: problems.append(m.text) if "Content Security Policy" in m.text else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("request", lambda r: problems.append(f"external request {r.url}") if not r.url.startswith(url)
            and not r.url.startswith("data:") else None)
    page.goto(f"{url}/dashboard")
    page.wait_for_selector("#keyform:not([hidden])")  # no key yet: the page asks, and shows nothing else
    page.fill("#key", key)
    page.click("#keyform button")
    return page


def fits_the_screen(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_every_view_shows_the_runs_data_to_its_key(browser, dashboard, run_dir, tmp_path):
    out = shots() or tmp_path
    out.mkdir(parents=True, exist_ok=True)
    journal = list(read_journal(run_dir / "spool"))
    trained_batches = {line["batch"] for line in journal if line["ev"] == "trained"}
    trained_ids = {s for line in journal if line["ev"] == "batch" and line["batch"] in trained_batches
                   for s in line["samples"]}
    turns = [line for line in journal if line["ev"] == "turn"]
    trained = next(t for t in turns if t["samples"] and t["samples"][0]["id"] in trained_ids)
    dropped = next(t for t in turns if t["drop"] and t["ns"] == trained["ns"])
    other = next(t for t in turns if t["session"] == "other-session")
    problems: list[str] = []

    page = open_page(browser, dashboard, KEYS[0], problems)
    page.wait_for_selector("#charts")
    assert page.inner_text("#card-steps .v") == "2"
    metrics = page.eval_on_selector_all("#charts .chart", "els => els.map(e => e.dataset.metric)")
    assert {"rollout/reward_mean", "train/loss", "train/rollout_fidelity_abs_diff",
            "sim/preferred_rate"} <= set(metrics)
    assert page.locator("#drops-chart rect").count() >= 1 and dropped["drop"] in page.inner_text("#drops-chart")
    sessions = page.eval_on_selector_all("#sessions tbody tr td:first-child", "els => els.map(e => e.innerText)")
    assert trained["session"] in sessions and "other-session" not in sessions
    assert fits_the_screen(page)
    page.screenshot(path=str(out / "dashboard-overview.png"), full_page=True)

    page.click(f"#sessions a[href='#/session/{trained['session']}']")
    page.wait_for_selector("#turns")
    assert "trained in step" in page.inner_text("#turns")
    page.goto(f"{dashboard}/dashboard#/turn/{trained['session']}/{trained['turn']}/{trained['epoch']}")
    page.wait_for_selector("#fate")
    fate = page.inner_text("#fate")
    assert fate.startswith("trained in step ") and "sampled by weights" in fate
    assert page.inner_text("#reply") == trained["reply"]
    assert page.inner_text("#next-state").endswith(trained["next_state"]["content"])
    if trained["judge"].get("hint"):
        assert page.inner_text("#hint") == trained["judge"]["hint"]
    assert page.locator("#judge .vote").count() == len(trained["judge"]["votes"])
    tokens = page.locator(".sample .tok")
    assert tokens.count() == len(trained["samples"][0]["ids"])
    assert "advantage" in tokens.first.get_attribute("title")
    tokens.first.click()  # a phone has no hover: a tap shows the value
    assert "advantage" in page.inner_text(".sample .tokinfo")
    assert fits_the_screen(page)
    page.screenshot(path=str(out / "dashboard-trained-turn.png"), full_page=True)

    page.goto(f"{dashboard}/dashboard#/turn/{dropped['session']}/{dropped['turn']}/{dropped['epoch']}")
    page.wait_for_selector(f"#fate:has-text('dropped: {dropped['drop']}')")  # (the CSP forbids wait_for_function's eval)
    assert page.inner_text("#fate").startswith(f"dropped: {dropped['drop']}")
    page.screenshot(path=str(out / "dashboard-dropped-turn.png"), full_page=True)

    # the other key's session is not reachable by URL either
    page.goto(f"{dashboard}/dashboard#/turn/other-session/1/{other['epoch']}")
    page.wait_for_selector("#view .bad")
    assert "no such turn for this key" in page.inner_text("#view")
    page.close()

    page = open_page(browser, dashboard, KEYS[1], problems)
    page.wait_for_selector("#sessions")
    sessions = page.eval_on_selector_all("#sessions tbody tr td:first-child", "els => els.map(e => e.innerText)")
    assert sessions == ["other-session"]
    page.close()
    assert problems == []
