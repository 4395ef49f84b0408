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


@pytest.mark.parametrize("env_value", [" ", ",", " , ", "k,", "k,,k2", "\t"])
def test_a_set_key_variable_that_parses_to_an_empty_key_is_refused(env_value):
    """SGLANG_API_KEY=" " or "," used to parse to no key at all: a loopback proxy without authentication."""
    with pytest.raises(ValueError) as e:
        load_settings({}, env={"SGLANG_API_KEY": env_value})
    assert "environment variable SGLANG_API_KEY: openclaw_proxy_api_keys: item #" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("value", ["", " ", ",", None])
def test_an_empty_yaml_key_list_is_refused(value):
    with pytest.raises(ValueError, match="proxy.yaml: openclaw_proxy_api_keys: (item #1|empty value)"):
        load_settings({"openclaw_proxy_api_keys": value}, env={}, sources={"openclaw_proxy_api_keys": "proxy.yaml"})


def test_unset_key_forms_still_mean_no_keys():
    assert load_settings({}, env={"SGLANG_API_KEY": ""}).proxy.api_keys == []  # upstream's "no key"
    assert load_settings({"openclaw_proxy_api_keys": []}, env={}).proxy.api_keys == []
    assert load_settings({}, env={"SGLANG_API_KEY": " a , b "}).proxy.api_keys == ["a", "b"]


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("openclaw_judge_votes: 3\nopenclaw_proxy_port: [1,\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: malformed YAML at line \d+, column \d+"):
        load_yaml(bad)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="list.yaml: expected a mapping of openclaw_\\* keys, got a list"):
        load_yaml(tmp_path / "list.yaml")


@pytest.mark.parametrize(("given", "expected"), [
    ("false", False), ("no", False), ("0", False), ("true", True), ("1", True), (False, False), (True, True),
    (None, None), ("none", None), ("null", None)])
def test_enable_thinking_takes_booleans_and_null_not_raw_strings(given, expected):
    """Its default is None, so its type is the declared one: "false" used to be kept as a string, which the
    chat template read as true."""
    assert load_settings({"openclaw_proxy_enable_thinking": given}).proxy.enable_thinking is expected


def test_enable_thinking_refuses_what_is_not_a_boolean():
    with pytest.raises(ValueError, match="openclaw_proxy_enable_thinking: expected a boolean"):
        load_settings({"openclaw_proxy_enable_thinking": "maybe"})


@pytest.mark.parametrize("unset", [None, "none", "None", "null"])
def test_rollout_temperature_can_be_unset_to_let_the_clients_through(unset):
    """None is the documented upstream behaviour; a YAML null and the word none were skipped or refused."""
    assert load_settings({"openclaw_proxy_rollout_temperature": unset}).proxy.rollout_temperature is None
    assert load_settings({"openclaw_proxy_rollout_temperature": "0.7"}).proxy.rollout_temperature == 0.7


def test_a_null_on_a_required_field_keeps_its_default_and_unset_slime_flags_change_nothing():
    assert load_settings({"openclaw_proxy_port": None}).proxy.port == 30000
    args = SimpleNamespace(openclaw_proxy_rollout_temperature=None, openclaw_proxy_enable_thinking=None)
    assert load_settings(slime_args=args, env={}).proxy.rollout_temperature == 1.0


def test_serve_flags_take_none_and_refuse_a_non_number_for_the_rollout_temperature():
    from openclaw_rl.cli import build_parser, settings_from_cli

    def settings(*flags: str):
        return settings_from_cli(build_parser().parse_args(["serve", *flags]))

    assert settings("--rollout-temperature", "none").proxy.rollout_temperature is None
    assert settings("--rollout-temperature", "0.6").proxy.rollout_temperature == 0.6
    assert settings().proxy.rollout_temperature == 1.0
    with pytest.raises(ValueError, match="--rollout-temperature: openclaw_proxy_rollout_temperature: expected a number"):
        settings("--rollout-temperature", "warm")


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                                ("[::1]", True), ("localhost", True), ("0.0.0.0", False),
                                                ("127.attacker.example.com", False), ("10.0.0.5", False),
                                                ("127.1", True), ("::ffff:127.0.0.1", True), ("127.0.0.1.nip.io", False)])
def test_loopback_means_a_loopback_address_not_a_name_that_starts_with_127(host, loopback):
    from openclaw_rl.config import is_loopback

    assert is_loopback(host) is loopback


@pytest.mark.parametrize(("values", "message"), [
    ({"openclaw_judge_temperature": -1.0}, "PRM_TEMPERATURE"),
    ({"openclaw_judge_temperature": float("nan")}, "PRM_TEMPERATURE"),
    ({"openclaw_judge_max_new_tokens": 0}, "PRM_MAX_NEW_TOKENS"),
    ({"openclaw_opd_teacher_concurrency": -2}, "OPENCLAW_OPD_TEACHER_LP_MAX_CONCURRENCY"),
    ({"openclaw_proxy_rollout_temperature": float("inf")}, "ROLLOUT_TEMPERATURE"),
    ({"openclaw_proxy_tool_parser": "qwen2.5"}, "unknown parser 'qwen2.5'"),
    ({"openclaw_proxy_reasoning_parser": "r1"}, "unknown parser 'r1'"),
])
def test_values_the_proxy_could_not_use_are_refused_at_start(values, message):
    with pytest.raises(ValueError, match=message):
        load_settings(values, env={})


def test_a_mistyped_key_gets_a_suggestion():
    with pytest.raises(ValueError, match=r"openclaw_judge_vote \(did you mean openclaw_judge_votes\?\)"):
        load_settings({"openclaw_judge_vote": 5}, env={})


def test_the_stream_gathering_window_is_a_setting_and_reaches_the_backend(policy_server, make_proxy):
    """``proxy_stream_gather_ms`` (``--stream-gather-ms``, ``OPENCLAW_STREAM_GATHER_MS``): 50 by default, never
    negative, and what a streamed turn's backend call gathers by."""
    import httpx

    assert load_settings({}, env={}).proxy.stream_gather_ms == 50.0
    assert load_settings({}, env={"OPENCLAW_STREAM_GATHER_MS": "80"}).proxy.stream_gather_ms == 80.0
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="stream_gather_ms"):
            load_settings({"openclaw_proxy_stream_gather_ms": bad}, env={})
    proxy, url = make_proxy(policy_server.url, proxy_stream_gather_ms=150)
    gathers = []
    stream = proxy.service.backend.generate_stream

    def recording(payload, routing_key=None, gather_s=0.0):
        gathers.append(gather_s)
        return stream(payload, routing_key, gather_s)

    proxy.service.backend.generate_stream = recording
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "stream": True},
                   headers={"X-Session-Id": "g"}, timeout=30)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]") and gathers == [0.15]
