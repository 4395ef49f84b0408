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


@pytest.mark.parametrize("values, message", [
    ({"openclaw_proxy_api_keys": 12345}, "cfg.yaml: openclaw_proxy_api_keys: expected a list of strings, got 12345"),
    ({"openclaw_proxy_port": "abc"}, "cfg.yaml: openclaw_proxy_port: expected an integer, got 'abc'"),
    ({"openclaw_proxy_port": 70000}, "openclaw_proxy_port: expected a TCP port 0-65535 (0 = any free port), got 70000"),
    ({"openclaw_judge_votes": [3]}, "cfg.yaml: openclaw_judge_votes: expected an integer, got [3]"),
    ({"openclaw_proxy_request_timeout_s": "soon"}, "openclaw_proxy_request_timeout_s: expected a number"),
    ({"openclaw_proxy_allow_insecure_bind": "maybe"}, "openclaw_proxy_allow_insecure_bind: expected a boolean"),
    ({"openclaw_proxy_tokenizer": {"a": 1}}, "openclaw_proxy_tokenizer: expected a string"),
    ({"openclaw_proxy_request_timeout_s": 0}, "openclaw_proxy_request_timeout_s: expected a positive number"),
])
def test_type_errors_name_the_file_key_and_expected_type(values, message):
    with pytest.raises(ValueError) as e:
        load_settings(values, env={}, sources={k: "cfg.yaml" for k in values})
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("keys", [[""], [" "], ["k", "\t"], ["k "], ["\xa0"], ["k\x00"]])
def test_empty_or_whitespace_api_keys_are_refused_at_start(keys):
    with pytest.raises(ValueError, match="openclaw_proxy_api_keys: key #"):
        load_settings({"proxy_host": "0.0.0.0", "proxy_api_keys": keys}, env={})
    with pytest.raises(ValueError, match="api_keys"):
        load_settings({"proxy_api_keys": keys}, env={})  # on loopback too


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("openclaw_judge_votes: 3\nopenclaw_proxy_port: [1,\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: malformed YAML at line \d+, column \d+"):
        load_yaml(bad)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="list.yaml: expected a mapping of openclaw_\\* keys, got a list"):
        load_yaml(tmp_path / "list.yaml")
