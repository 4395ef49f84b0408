"""The embedded engine serves many LoRA adapters at once, chosen per request (``engine/adapters.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from openclaw_rl.engine.adapters import lora_config
from openclaw_rl.engine.model import SamplingConfig
from openclaw_rl.engine.torch_core import TorchModel


def random_adapter(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """A trained-looking adapter: PEFT's state dict with non-zero B (a fresh adapter is the base model)."""
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), lora_config(), adapter_name="x")
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(peft, adapter_name="x").items()}


def greedy(max_new: int = 6, adapter: str | None = None) -> SamplingConfig:
    return SamplingConfig(temperature=0.0, top_p=1.0, top_k=-1, min_p=0.0, max_new_tokens=max_new, adapter=adapter)


async def run(core: TorchModel, prompt: list[int], sampling: SamplingConfig) -> list[Any]:
    return [step async for step in core.generate(prompt, sampling)]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {"ua": random_adapter(tiny_model_dir, 1), "ub": random_adapter(tiny_model_dir, 2)}


def test_one_batch_mixes_adapters_and_each_row_gets_its_own(tiny_model_dir: Path, adapters: Any) -> None:
    """Three concurrent requests (ua, ub, base) decode in one batch; each equals its adapter served alone,
    and its tokens carry its adapter's version."""
    core = TorchModel.from_pretrained(str(tiny_model_dir))
    core.enable_lora(lora_config())
    prompt = list(range(5, 17))
    try:
        base_alone = asyncio.run(run(core, prompt, greedy()))
        for name, state in adapters.items():
            core.load_adapter(name, state, f"{name}-v1")
        alone = {n: asyncio.run(run(core, prompt, greedy(adapter=n))) for n in adapters}

        async def together() -> list[list[Any]]:
            return list(await asyncio.gather(run(core, prompt, greedy(adapter="ua")),
                                             run(core, prompt, greedy(adapter="ub")), run(core, prompt, greedy())))
        mixed = asyncio.run(together())
    finally:
        core.close()
    ids = lambda steps: [s.token_id for s in steps]  # noqa: E731
    assert ids(alone["ua"]) != ids(base_alone) or ids(alone["ub"]) != ids(base_alone)
    assert [ids(m) for m in mixed] == [ids(alone["ua"]), ids(alone["ub"]), ids(base_alone)]
    for m, single in zip(mixed, [alone["ua"], alone["ub"], base_alone]):
        assert max(abs(a.logprob - b.logprob) for a, b in zip(m, single)) < 1e-4
    assert {s.weight_version for s in mixed[0]} == {"ua-v1"}
    assert {s.weight_version for s in mixed[1]} == {"ub-v1"}
    assert {s.weight_version for s in mixed[2]} == {"default"}


def test_adapter_replace_unload_and_refusals(tiny_model_dir: Path, adapters: Any) -> None:
    core = TorchModel.from_pretrained(str(tiny_model_dir))
    core.enable_lora(lora_config())
    prompt = list(range(5, 17))
    try:
        base = [s.token_id for s in asyncio.run(run(core, prompt, greedy()))]
        core.load_adapter("ua", adapters["ua"], "v1")
        core.load_adapter("ua", adapters["ub"], "v2")  # replaced in place: now serves ub's weights
        core.load_adapter("ub", adapters["ub"], "v1")
        as_ub = [s.token_id for s in asyncio.run(run(core, prompt, greedy(adapter="ub")))]
        replaced = asyncio.run(run(core, prompt, greedy(adapter="ua")))
        assert [s.token_id for s in replaced] == as_ub and replaced[0].weight_version == "v2"
        wrong = {k: v[:1] for k, v in adapters["ua"].items()}
        with pytest.raises(ValueError, match="shape"):
            core.load_adapter("uc", wrong, "v1")
        assert sorted(core.adapter_names()) == ["ua", "ub"]  # the refused one left nothing behind
        core.unload_adapter("ua")
        with pytest.raises(ValueError, match="not loaded"):
            asyncio.run(run(core, prompt, greedy(adapter="ua")))
        # the base model is untouched by everything above (the placeholder adapter adds exactly zero)
        assert [s.token_id for s in asyncio.run(run(core, prompt, greedy()))] == base
    finally:
        core.close()


def test_an_adapter_row_never_reuses_a_base_rows_cached_prompt_head(tiny_model_dir: Path, adapters: Any) -> None:
    """The prefix cache holds the base model's keys and values: a row of an adapter must prefill its own."""
    head = [5 + i % 90 for i in range(80)]  # over the cache's 64-token minimum
    longer = head + [41, 42, 43]
    outs = []
    for entries in (4, 0):  # with the prefix cache, and without any
        core = TorchModel.from_pretrained(str(tiny_model_dir), prefix_cache_entries=entries)
        core.enable_lora(lora_config())
        core.load_adapter("ua", adapters["ua"], "v1")
        try:
            asyncio.run(run(core, head, greedy(1)))  # a base row caches the head
            outs.append(asyncio.run(run(core, longer, greedy(adapter="ua"))))
        finally:
            core.close()
    cached, fresh = outs
    assert [s.token_id for s in cached] == [s.token_id for s in fresh]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(cached, fresh)) < 1e-4
