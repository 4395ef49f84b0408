"""Learning from OpenClaw-shaped conversations: the replay harness drives ``openclaw-rl local``'s stack
(proxy, embedded engine, rule judge, hinted teacher, trainer) with OpenClaw's recorded request shape and
a scripted user who corrects the style; one OPD step on the corrected turns must raise the exact
probability that a reply to an OpenClaw-shaped request opens in the preferred style.

Reduced (one step of two samples; 30 interactions so that the users do not end before the teacher has
scored them: measured 4% -> 9% in 108 s), still minutes on two busy cores: the replies
are cheap since the engine's prefix cache reuses OpenClaw's ~15K-token system prompt, but the teacher
scores and the trainer runs a forward and a backward over each ~15.6K-token sample (plus ~13 minutes to
build the OpenClaw variant once per change of openclaw_rl/embedded), so it runs in the full suite only
(OPENCLAW_TEST_FULL=1). The full figure comes from scripts/openclaw_replay_learning.py (README, "Learning
from OpenClaw conversations, measured").
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("OPENCLAW_TEST_FULL") != "1",
                    reason="~8 min on 2 cores (every request is a 15.6K-token OpenClaw prompt), plus ~13 min to "
                           "build the OpenClaw variant once: full suite only (OPENCLAW_TEST_FULL=1)")
def test_the_openclaw_replay_trains_and_moves_the_preferred_probability(tmp_path, monkeypatch, tiny_model_dir):
    # local's OpenClaw variant, built once (~13 min) next to the suite's cached tiny model. The plain model
    # is no use here: on OpenClaw's prompt it mostly loops `</think>`, and one step on those samples at
    # lr 2e-3 drove the preferred opener from 9% to 3e-6 (measured).
    monkeypatch.setenv("OPENCLAW_RL_CACHE", str(tiny_model_dir.parent))
    spec = importlib.util.spec_from_file_location("replay", REPO / "scripts" / "openclaw_replay_learning.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    # OPD: the variant follows the hint inside OpenClaw's prompt, so its frozen hinted teacher prefers the
    # preferred opener on every corrected turn (8 such steps took it from 5% to 93%, README). The users must
    # outlast the first batch: when they end, `local` stops without training what is still being scored.
    ns = script.build_parser().parse_args([  # the script's own parser: every setting it reads is there
        "--mode", "opd", "--model", "openclaw", "--preferred-style", "formal", "--interactions", "30", "--turns", "3",
        "--concurrency", "2", "--batch-size", "2", "--lr", "5e-4", "--max-steps", "1", "--max-new-tokens", "24",
        "--window", "3", "--probes", "1", "--heldout-n", "0", "--out-dir", str(tmp_path / "replay"), "--no-progress"])
    result = script.replay(ns)
    print(result["exact_preferred_before"], "->", result["exact_preferred_after"], f"{result['seconds']:.0f}s")
    assert result["steps"] == 1 and result["interactions"] >= 2
    assert max(result["logprob_abs_diff"]) <= 1e-4  # the trained tokens are the sampled ones, same weights
    # teacher minus student log-probs on corrected replies: one step at the default lr lifts the opener
    assert result["exact_preferred_after"] > result["exact_preferred_before"]
