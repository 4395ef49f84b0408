"""Optional: ``openclaw-rl train`` against a real SGLang 0.5.23 server on CPU.

Enabled by ``OPENCLAW_SGLANG_PYTHON`` (the python of a venv with sglang 0.5.23; ``scripts/test_real_sglang.sh``
installs one and runs this file). SGLang runs on CPU only with ``--model-impl transformers``; ``--dtype
float32`` because SGLang serves a float32 checkpoint in float16 by default, which costs the rollout/trainer
log-prob agreement two orders of magnitude. The server gets a private HOME and TMPDIR (it writes caches and
ZMQ sockets there) and is stopped by its process group, which this test created.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from external_support import step_and_sync, tiny_qwen3_checkpoint, train_settings

from openclaw_rl.embedded.external import ExternalConfig, run_train
from openclaw_rl.embedded.hf_policy import PolicyLoadConfig, load_policy
from openclaw_rl.servers import free_port

SGLANG_PYTHON = os.environ.get("OPENCLAW_SGLANG_PYTHON", "")
pytestmark = pytest.mark.skipif(
    not (SGLANG_PYTHON and os.access(SGLANG_PYTHON, os.X_OK)),
    reason="real SGLang is not installed: run scripts/test_real_sglang.sh, or set OPENCLAW_SGLANG_PYTHON to the "
           "python of a venv with sglang==0.5.23 (scripts/install_sglang_cpu.sh makes one)")

STARTUP_TIMEOUT_S = 600.0  # 25-40 s on an idle 2-core machine, 104-257 s measured on a new user's


def sglang_command(model_dir: Path, port: int, extra: Sequence[str] = ()) -> list[str]:
    """The CPU launch line documented in docs/deployment.md (``extra``: more flags, e.g. LoRA's)."""
    return [SGLANG_PYTHON, "-m", "sglang.launch_server", "--model-path", str(model_dir), "--model-impl", "transformers",
            "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port),
            "--max-total-tokens", "16384", "--context-length", "4096", "--disable-cuda-graph", *extra]


@pytest.fixture
def sglang_server(tiny_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    with launch_sglang(tiny_model_dir, tmp_path) as url:
        yield url


@contextmanager
def launch_sglang(model_dir: Path, tmp_path: Path, extra: Sequence[str] = ()) -> Iterator[str]:
    port = free_port()
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log_path = tmp_path / "sglang.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(sglang_command(model_dir, port, extra), env=env, stdout=log_file,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"SGLang exited with {proc.returncode} during start-up:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/model_info", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"SGLang did not answer within {STARTUP_TIMEOUT_S}s:\n{log_path.read_text()[-3000:]}")
            time.sleep(1.0)  # polling a process we do not control: there is no event to wait on
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def test_train_against_real_sglang_syncs_versioned_weights(sglang_server, rule_judge, tiny_model_dir, tmp_path):
    info = httpx.get(f"{sglang_server}/model_info").json()
    assert info["weight_version"] == "default"
    cfg = ExternalConfig(model=str(tiny_model_dir), settings=train_settings(sglang_server, rule_judge.url, tmp_path),
                         policy=PolicyLoadConfig(device="cpu", dtype="float32"), out_dir=str(tmp_path / "run"),
                         rollout_batch_size=6, lr=5e-4, max_steps=3, simulate_interactions=120,
                         simulate_concurrency=4, max_new_tokens=24)
    report = run_train(cfg, echo=True)

    assert report.steps == 3
    assert report.versions == ["step-1", "step-2", "step-3"]
    assert httpx.get(f"{sglang_server}/model_info").json()["weight_version"] == "step-3"
    rows = [json.loads(line) for line in Path(report.metrics_path).read_text().splitlines()]
    print(json.dumps([{k: r[k] for k in sorted(r) if k.startswith(("train/rollout_fidelity", "train/staleness",
                                                                   "train/stale", "perf/sync"))} for r in rows]))
    # Step 3 trains samples drawn with the weights SGLang loaded at the first sync: each is re-scored with the trainer's copy of the version SGLang reported, so a small gap
    # shows SGLang served exactly the synced weights (fp32: about 1e-5; unsynced weights give ~1e-1).
    assert report.fidelity and max(report.fidelity) < 1e-3, report.fidelity
    assert all(r["train/staleness_max"] <= cfg.max_staleness for r in rows)
    assert rows[2]["train/staleness_min"] == 1.0  # step 3 trained samples SGLang drew with the step-1 weights


def test_lora_on_a_qwen3_checkpoint_syncs_merged_weights_into_real_sglang(tmp_path, tokenizer):
    """LoRA trained here, merged into full weights, loaded by SGLang with /update_weights_from_disk
    (SGLang's own adapter loading is not used). Untied lm_head, as in Qwen3-8B; q/k norms, GQA."""
    ckpt = tiny_qwen3_checkpoint(tmp_path / "qwen3", tokenizer, tie=False)
    model = load_policy(str(ckpt), PolicyLoadConfig(device="cpu", dtype="float32", gradient_checkpointing=True,
                                                     lora_rank=4))
    with launch_sglang(ckpt, tmp_path) as url:
        out = step_and_sync(url, model, tokenizer, tmp_path / "sync")
    print({k: out[k] for k in ("version", "fresh_versions", "synced", "moved")},
          {k: v for k, v in out["metrics"].items() if "fidelity" in k})
    assert out["metrics"]["train/rollout_fidelity_abs_diff"] < 1e-4  # SGLang fp32 vs the trainer, same weights
    assert out["version"] == "step-1" and out["fresh_versions"] == {"step-1"}
    assert out["synced"] < 1e-3 < 1e-2 < out["moved"], (out["synced"], out["moved"])


def test_streamed_turns_at_interval_8_assemble_what_interval_1_does(sglang_server, make_proxy):
    """The proxy's per-request ``stream_interval`` against real SGLang, both intervals greedy (rollout
    temperature 0) so the two replies are the same tokens: the samples must hold
    the same ids and text, and log-probs equal within SGLang's run-to-run noise (prefix caching)."""
    from support import wait_for_samples

    samples, texts = {}, {}
    for interval in (1, 8):
        proxy, url = make_proxy(sglang_server, proxy_stream_interval=interval, proxy_rollout_temperature=0.0,
                                rl_keep_masked_samples=True)
        req = {"messages": [{"role": "user", "content": "Tell me about Paris."}], "stream": True, "max_tokens": 40}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=req, timeout=120,
                          headers={"X-Session-Id": f"i{interval}", "X-Session-Done": "1"}) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert not any("error" in e for e in events), events
        texts[interval] = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
        samples[interval] = wait_for_samples(proxy, 1)[0]
        assert proxy.service.backend.stream_interval == interval  # SGLang 0.5.23 accepted the field
    one, eight = samples[1], samples[8]
    assert texts[1] == texts[8]
    assert one.response_ids == eight.response_ids and len(one.response_ids) > 8
    assert max(abs(a - b) for a, b in zip(one.rollout_log_probs, eight.rollout_log_probs)) < 1e-3


def test_top_logprobs_from_real_sglang(sglang_server, make_proxy):
    """``top_logprobs`` goes to SGLang as ``top_logprobs_num``; greedy, each sampled token is its own top one.
    Streamed, the same tokens come with their own log-probs."""
    proxy, url = make_proxy(sglang_server, proxy_rollout_temperature=0.0)
    req = {"messages": [{"role": "user", "content": "Tell me about Paris."}], "max_tokens": 12, "logprobs": True,
           "top_logprobs": 3}
    answer = httpx.post(f"{url}/v1/chat/completions", json=req, timeout=120).json()
    entries = answer["choices"][0]["logprobs"]["content"]
    assert len(entries) == answer["usage"]["completion_tokens"] > 0
    for e in entries:
        assert len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["bytes"] == e["bytes"]
        assert e["top_logprobs"][0]["logprob"] == pytest.approx(e["logprob"], abs=1e-4)
    req |= {"stream": True, "top_logprobs": 0}  # streamed: the same tokens' own log-probs, chunk by chunk
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=req, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    streamed = [e for ev in events for c in ev["choices"] if c.get("logprobs") for e in c["logprobs"]["content"]]
    assert [e["bytes"] for e in streamed] == [e["bytes"] for e in entries]
    assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(streamed, entries)) < 1e-3


def test_a_stream_aborted_by_slimes_pause_is_resumed_whole(sglang_server, make_proxy):
    """Slime pauses SGLang for each weight update with ``/pause_generation`` (abort mode): real SGLang
    ends the running request with an abort, and the proxy resumes it from its tokens. Greedy, so the
    resumed reply is the same tokens as an uninterrupted one."""
    import threading

    from support import wait_for_samples

    replies = {}
    for name in ("whole", "paused"):
        proxy, url = make_proxy(sglang_server, proxy_rollout_temperature=0.0, rl_keep_masked_samples=True)
        req = {"messages": [{"role": "user", "content": "Tell me about Paris."}], "stream": True, "max_tokens": 300}
        first_token = threading.Event()

        def pause_once(first_token: threading.Event = first_token) -> None:
            first_token.wait(60)
            assert httpx.post(f"{sglang_server}/pause_generation", json={}, timeout=60).status_code == 200
            assert httpx.post(f"{sglang_server}/continue_generation", json={}, timeout=60).status_code == 200

        pauser = threading.Thread(target=pause_once)
        if name == "paused":
            pauser.start()
        events = []
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=req, timeout=120,
                          headers={"X-Session-Id": name, "X-Session-Done": "1"}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    first_token.set()
        if name == "paused":
            pauser.join()
        assert not any("error" in e for e in events), events
        sample = wait_for_samples(proxy, 1)[0]
        replies[name] = (sample.response_ids, proxy.service.backend.resumed)
        assert len(sample.rollout_log_probs) == len(sample.response_ids)
    assert replies["whole"][1] == 0 and replies["paused"][1] == 1, replies
    print(len(replies["whole"][0]), len(replies["paused"][0]))
    assert replies["paused"][0] == replies["whole"][0]
