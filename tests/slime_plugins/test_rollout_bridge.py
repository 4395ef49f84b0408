"""Slime's view: the rollout hooks resolved by dotted path, called with a Slime-like ``args``."""

from __future__ import annotations

import importlib
import inspect
import threading
from types import SimpleNamespace

import httpx
import pytest
from support import wait_until

from openclaw_rl.modes import MODES
from openclaw_rl.servers import free_port

HOOKS = {mode.slime.rollout: name for name, mode in MODES.items()}


def resolve(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path", list(HOOKS) + [p.rsplit(".", 1)[0] + ".generate" for p in HOOKS]
                         + [p.rsplit(".", 1)[0] + ".reward_func" for p in HOOKS])
def test_hooks_have_slime_signatures(path):
    fn = resolve(path)
    params = list(inspect.signature(fn).parameters)
    if path.endswith(".generate"):
        assert inspect.iscoroutinefunction(fn) and params[:3] == ["args", "sample", "sampling_params"]
        assert "evaluation" in params
    elif path.endswith(".reward_func"):
        assert inspect.iscoroutinefunction(fn) and params[:2] == ["args", "sample_or_samples"]
    else:
        assert params == ["args", "rollout_id", "data_source", "evaluation"]


@pytest.fixture
def slime_args(policy_server, judge_server, tiny_model_dir, tmp_path):
    from openclaw_rl.slime_hooks.bridge import shutdown_runtimes

    host, port = policy_server.url.rsplit(":", 1)
    jhost, jport = judge_server.url.rsplit(":", 1)
    args = SimpleNamespace(rollout_batch_size=2, n_samples_per_prompt=1, hf_checkpoint=str(tiny_model_dir),
                           sglang_router_ip=host.removeprefix("http://"), sglang_router_port=int(port),
                           prm_router_ip=jhost.removeprefix("http://"), prm_router_port=int(jport), prm_m=1,
                           rollout_temperature=1.0, openclaw_proxy_port=free_port(),
                           openclaw_spool_dir=str(tmp_path / "spool"), openclaw_judge_max_new_tokens=64)
    yield args
    shutdown_runtimes()


def chat(url: str, sid: str, messages: list[dict]) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"messages": messages}, headers={"X-Session-Id": sid},
                      timeout=30)


def test_rollout_waits_for_a_batch_pauses_and_keeps_leftovers(slime_args):
    from openclaw_rl.slime_hooks.bridge import _RUNTIMES
    from openclaw_rl.slime_hooks.samples import RolloutFnTrainOutput

    fn = resolve("openclaw_rl.rollout.generate_rollout_openclaw")
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(out=fn(slime_args, 0, None)))
    worker.start()
    url = f"http://127.0.0.1:{slime_args.openclaw_proxy_port}"
    wait_until(lambda: "rl" in _RUNTIMES and _RUNTIMES["rl"].proxy.gate.is_open, timeout=120)  # the proxy is up
    convo = [{"role": "user", "content": "hi"}]
    for i, reply in enumerate(["thanks!", "thanks again", "thanks, bye"]):
        r = chat(url, "s", convo)
        assert r.status_code == 200, r.text
        convo += [r.json()["choices"][0]["message"], {"role": "user", "content": reply}]
        if i == 2 or not worker.is_alive():
            break
    worker.join(30)
    out = result["out"]
    assert isinstance(out, RolloutFnTrainOutput)
    assert len(out.samples) == 2 and all(len(g) == 1 for g in out.samples)
    s = out.samples[0][0]
    assert s.reward == {"score": 1.0} and s.response_length == len(s.loss_mask) == len(s.rollout_log_probs)
    assert s.tokens[-s.response_length:] and s.group_index == s.index
    assert out.metrics["rollout/prm_eval_score"] == 1.0
    # the gate is closed until the next rollout call: upstream's 503 + Retry-After
    assert chat(url, "s", convo).status_code == 503
    runtime = _RUNTIMES["rl"]
    assert runtime.proxy.spool.depth() >= 2  # leased, not yet acknowledged


def test_rollout_timeout_message_names_what_is_missing(slime_args):
    from openclaw_rl.slime_hooks.bridge import get_runtime

    runtime = get_runtime(slime_args, "rl")
    with pytest.raises(TimeoutError, match="0/3 samples"):
        runtime.collect(3, timeout_s=0.2)
    assert not runtime.proxy.gate.is_open
