"""Optional: per-user adapters (``SGLangAdapterSync``) against a real SGLang 0.5.23 started with ``--enable-lora``.

Enabled like ``test_real_sglang.py`` by ``OPENCLAW_SGLANG_PYTHON``. It launches SGLang with the LoRA flags of
docs/users.md, publishes a PEFT adapter through the project's own ``SGLangAdapterSync`` (``/load_lora_adapter``),
asks ``/generate`` with ``lora_path`` for the prompt's log-probs and compares them with PEFT's on the same
weights, replaces the adapter with a new version (the old name is unloaded) and unloads it.

On a machine without an NVIDIA driver SGLang 0.5.23 cannot start with ``--enable-lora`` at all: its LoRA
layers allocate pinned host memory (``torch.tensor(..., pin_memory=True)`` in ``sglang/srt/lora/layers.py``),
which needs the CUDA driver even with ``--device cpu --lora-backend torch_native``. The test then skips with
the error SGLang printed (measured on the 2-core CPU machine, 3 December 2026; docs/users.md). With pinning
made a no-op (a diagnostic only), the next failure is the ``transformers`` backend handing SGLang's LoRA
layers 3-D activations (``ValueError`` in ``sglang/srt/lora/torch_ops/lora_ops.py`` at the warm-up request),
so where a driver is present this launch line is expected to fail that way: the assertions below have not
run yet, and need SGLang's native model path on a GPU.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from test_real_sglang import launch_sglang

from openclaw_rl.users.sglang_adapters import SGLangAdapterSync
from openclaw_rl.users.train_wiring import check_lora_server

SGLANG_PYTHON = os.environ.get("OPENCLAW_SGLANG_PYTHON", "")
pytestmark = pytest.mark.skipif(
    not (SGLANG_PYTHON and os.access(SGLANG_PYTHON, os.X_OK)),
    reason="real SGLang is not installed: run scripts/test_real_sglang.sh, or set OPENCLAW_SGLANG_PYTHON to the "
           "python of a venv with sglang==0.5.23 (scripts/install_sglang_cpu.sh makes one)")

RANK = 8
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# `--lora-target-modules all` also wraps the embedding, which fails the same way one step earlier on CPU.
LORA_FLAGS = ("--enable-lora", "--max-lora-rank", str(RANK), "--lora-target-modules", *TARGETS,
              "--lora-backend", "torch_native", "--max-loaded-loras", "8")
NO_DRIVER = "Found no NVIDIA driver on your system"


@pytest.fixture
def lora_sglang(tiny_model_dir: Path, tmp_path: Path) -> Iterator[str]:
    try:
        with launch_sglang(tiny_model_dir, tmp_path, LORA_FLAGS) as url:
            yield url
    except pytest.fail.Exception as exc:
        if NO_DRIVER not in str(exc):
            raise
        where = re.findall(r'File "[^"]*/(sglang/srt/lora/[^"]+)", line (\d+)', str(exc))
        error = next(line for line in str(exc).splitlines() if NO_DRIVER in line)
        pytest.skip(f"SGLang 0.5.23 cannot serve LoRA without an NVIDIA driver: with --enable-lora it exits during "
                    f"start-up at {':'.join(where[-1]) if where else 'its LoRA manager'} (pinned host memory): {error.strip()}")


def peft_adapter(model_dir: Path, lora: Any, seed: int) -> tuple[Any, dict[str, torch.Tensor]]:
    """The tiny model with one adapter of random (non-zero) weights, and that adapter's PEFT state dict."""
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), copy.deepcopy(lora))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model.eval(), {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}


def reference(model: Any, ids: list[int], *, adapter: bool) -> list[float]:
    with torch.no_grad():
        if adapter:
            logits = model(torch.tensor([ids])).logits[0]
        else:
            with model.disable_adapter():
                logits = model(torch.tensor([ids])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    return [logp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]


def served(url: str, ids: list[int], lora: str | None) -> httpx.Response:
    body: dict[str, Any] = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                            "return_logprob": True, "logprob_start_len": 0}
    if lora is not None:
        body["lora_path"] = lora
    return httpx.post(f"{url}/generate", json=body, timeout=300)


def prompt_log_probs(url: str, ids: list[int], lora: str | None) -> list[float]:
    resp = served(url, ids, lora)
    assert resp.status_code == 200, resp.text
    return [entry[0] for entry in resp.json()["meta_info"]["input_token_logprobs"]][1:]


def gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) > 0
    return max(abs(x - y) for x, y in zip(a, b))


def test_adapters_published_replaced_and_unloaded_in_real_sglang(lora_sglang, tiny_model_dir, tokenizer, tmp_path):
    from openclaw_rl.engine.adapters import lora_config

    check_lora_server(httpx.get(f"{lora_sglang}/server_info").json(), RANK)  # what `train` checks at start
    lora = lora_config(RANK, 2 * RANK, TARGETS)
    ids = tokenizer("Tell me about Paris. The city is")["input_ids"]
    sync = SGLangAdapterSync(lora_sglang, tmp_path / "sync", lora)
    try:
        first, state1 = peft_adapter(tiny_model_dir, lora, seed=1)
        name1 = sync.load("u1", state1, "step-1")
        base_ref, ref1 = reference(first, ids, adapter=False), reference(first, ids, adapter=True)
        assert gap(base_ref, ref1) > 0.1  # the adapter changes the prompt's log-probs
        assert gap(prompt_log_probs(lora_sglang, ids, None), base_ref) < 1e-3  # fp32 both
        assert gap(prompt_log_probs(lora_sglang, ids, name1), ref1) < 1e-3

        second, state2 = peft_adapter(tiny_model_dir, lora, seed=2)
        name2 = sync.load("u1", state2, "step-2")  # loads the new name, then unloads name1
        assert name2 != name1
        assert gap(prompt_log_probs(lora_sglang, ids, name2), reference(second, ids, adapter=True)) < 1e-3
        assert served(lora_sglang, ids, name1).status_code != 200  # the old version is gone

        sync.unload("u1")
        assert served(lora_sglang, ids, name2).status_code != 200
        assert gap(prompt_log_probs(lora_sglang, ids, None), base_ref) < 1e-3  # the base never changed
    finally:
        sync.close()
