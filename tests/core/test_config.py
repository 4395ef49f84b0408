"""Settings: every config file key is read by the code, fallbacks have the documented precedence."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from openclaw_rl.config import flat_keys, load_settings, load_yaml

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_key_is_known_and_loads(path):
    values = load_yaml(path)
    assert {k.removeprefix("openclaw_") for k in values} <= flat_keys()
    settings = load_settings(values, env={})
    assert settings.mode == values["mode"]


def test_unknown_keys_fail_loudly():
    with pytest.raises(ValueError, match="unknown openclaw setting"):
        load_settings({"openclaw_judge_vote": 3}, env={})


def test_precedence_explicit_over_env_over_slime_args():
    args = SimpleNamespace(prm_m=5, hf_checkpoint="/ckpt", rollout_temperature=0.6, sglang_router_ip="10.0.0.1",
                           sglang_router_port=3000, prm_router_ip=None, prm_router_port=None)
    s = load_settings({}, env={}, slime_args=args)
    assert (s.judge.votes, s.proxy.tokenizer, s.proxy.rollout_temperature) == (5, "/ckpt", 0.6)
    assert s.proxy.policy_url == "http://10.0.0.1:3000" and s.judge.url == ""
    s = load_settings({}, env={"PRM_M": "3", "SGLANG_API_KEY": "k", "PORT": "31000"}, slime_args=args)
    assert (s.judge.votes, s.proxy.api_keys, s.proxy.port) == (3, ["k"], 31000)
    s = load_settings({"openclaw_judge_votes": 7}, env={"PRM_M": "3"}, slime_args=args)
    assert s.judge.votes == 7


def test_public_bind_needs_a_key():
    with pytest.raises(ValueError, match="without an API key"):
        load_settings({"proxy_host": "0.0.0.0"}, env={})
    assert load_settings({"proxy_host": "0.0.0.0", "proxy_api_keys": ["k"]}, env={}).proxy.host == "0.0.0.0"
    assert load_settings({"proxy_host": "0.0.0.0", "proxy_allow_insecure_bind": True}, env={})
