"""Per-user adapters over SGLang's HTTP protocol: ``/load_lora_adapter`` into the engine, ``lora_path`` per
request from the proxy, and the turn labelled with the adapter's version (``users/sglang_adapters.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from support import record_generate

from openclaw_rl.engine.adapters import lora_config
from openclaw_rl.errors import CommandError
from openclaw_rl.users.adapters import adapter_name
from openclaw_rl.users.identity import key_namespace
from openclaw_rl.users.sglang_adapters import AdapterSyncError, SGLangAdapterSync
from openclaw_rl.users.train_wiring import check_lora_server


def some_adapter(model_dir: Path) -> dict[str, torch.Tensor]:
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), lora_config(), adapter_name="x")
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(peft, adapter_name="x").items()}


def generate(url: str, lora: str | None) -> httpx.Response:
    body: dict[str, Any] = {"input_ids": [5, 6, 7, 8], "return_logprob": True,
                            "sampling_params": {"max_new_tokens": 3, "temperature": 0.0}}
    if lora is not None:
        body["lora_path"] = lora
    return httpx.post(f"{url}/generate", json=body, timeout=60)


def test_adapter_versions_load_by_name_and_the_old_name_is_unloaded(lora_engine: Any, tiny_model_dir: Path,
                                                                    tmp_path: Path) -> None:
    core, url = lora_engine
    info = httpx.get(f"{url}/server_info", timeout=10).json()
    check_lora_server(info, 8)
    with pytest.raises(CommandError, match="max-lora-rank"):
        check_lora_server(info, 16)
    sync = SGLangAdapterSync(url, tmp_path / "adapters", lora_config())
    state = some_adapter(tiny_model_dir)
    try:
        first = sync.load("ualice", state, "step-1")
        assert generate(url, first).status_code == 200
        second = sync.load("ualice", {k: -v for k, v in state.items()}, "step-2")
        assert core.adapter_names() == [second] != [first]
        assert generate(url, first).status_code == 400  # the old version's name is gone
        assert generate(url, second).json()["meta_info"]["weight_version"] == "step-2"
        with pytest.raises(AdapterSyncError, match="refused"):
            sync.load("ualice", {k: v[:1] for k, v in state.items()}, "step-3")  # a wrong shape is refused
        assert core.adapter_names() == [second]
    finally:
        sync.close()


def test_an_engine_without_lora_refuses_lora_path_and_train_refuses_it(tokenizer: Any, policy_server: Any) -> None:
    resp = generate(policy_server.url, "ualice")
    assert resp.status_code == 400 and "lora_path" in resp.text
    with pytest.raises(CommandError, match="enable-lora"):
        check_lora_server({"enable_lora": None}, 8)


def test_the_proxy_sends_each_users_adapter_and_labels_the_turn_with_its_version(
        lora_engine: Any, make_proxy: Any, tiny_model_dir: Path) -> None:
    core, url = lora_engine
    proxy, base = make_proxy(url, proxy_api_keys=["front"], proxy_trusted_user_keys=["front"],
                             proxy_per_user_adapters=True, proxy_rollout_temperature=0.0)
    alice = f"{key_namespace('front')}/alice"
    core.load_adapter(adapter_name(alice) + "_step_7", some_adapter(tiny_model_dir), "default")
    proxy.service.adapters.loaded(alice, "step-7", adapter_name(alice) + "_step_7")  # as train publishes to SGLang
    carol = f"{key_namespace('front')}/carol"  # as local publishes: one name, the engine labels the version
    core.load_adapter(adapter_name(carol), some_adapter(tiny_model_dir), "step-2")  # replaced after admission
    proxy.service.adapters.loaded(carol, "step-1")
    seen = record_generate(proxy)
    for user in ("alice", "bob", "carol"):
        r = httpx.post(f"{base}/v1/chat/completions", timeout=60,
                       headers={"Authorization": "Bearer front", "X-User-Id": user, "X-Session-Id": f"s-{user}"},
                       json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
    assert seen[0].get("lora_path") == adapter_name(alice) + "_step_7" and "lora_path" not in seen[1]
    turns = {t.session_key.partition("\x1f")[0]: t for session in list(proxy.tracker.sessions.values())
             for t in list(session.turns.values())}
    assert turns[alice].generation.weight_version == "step-7"
    assert turns[f"{key_namespace('front')}/bob"].generation.weight_version == "default"
    assert seen[2].get("lora_path") == adapter_name(carol) and turns[carol].generation.weight_version == "step-2"
