"""The real core (`TorchModel`) under the SGLang-compatible layer, checked against plain transformers.

The trainer recomputes log-probs with one full forward, `log_softmax(model(prompt + response).logits / T)`,
so every rollout log-prob must match that to 1e-4, alone or batched with requests of other lengths
that join mid-flight. HTTP tests share one server; tests that touch the scheduler or the weights
drive a private core directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from openclaw_rl.engine import EngineModel, SamplingConfig, TokenStep, make_engine_app
from openclaw_rl.engine.serve import register_engine_command
from openclaw_rl.engine.torch_core import LOOKAHEAD, TorchModel
from openclaw_rl.servers import BackgroundServer

TOL = 1e-4


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> Any:
    """An independent copy of the checkpoint: the trainer's view."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).float().eval()


@pytest.fixture(scope="module")
def prompts(tokenizer: Any) -> list[list[int]]:
    texts = ["What is the weather in Paris?", "hi", "List the files in the current folder, then think first.",
             "Write a short poem about the sea and the wind and the boats that sail at night."]
    out = []
    for text in texts:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=True)
        out.append(list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered))
    assert len({len(p) for p in out}) == 4
    return out


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, tokenizer: Any) -> Iterator[tuple[TorchModel, httpx.Client]]:
    core = TorchModel.from_pretrained(tiny_model_dir, tokenizer_vocab_size=len(tokenizer))
    app = make_engine_app(core, tokenizer, served_model_name="tiny", model_path=str(tiny_model_dir))
    server = BackgroundServer(app).start()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield core, client
    server.stop()


def post(client: httpx.Client, **body: Any) -> Any:
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def full_logprobs(model: Any, ids: Sequence[int], temperature: float = 1.0) -> torch.Tensor:
    """The trainer's recompute: row p is the distribution of ids[p + 1]."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([list(ids)])).logits[0].float() / temperature, dim=-1)


def max_gap(model: Any, prompt: Sequence[int], output_ids: Sequence[int], logprobs: Sequence[float],
            temperature: float) -> float:
    lp = full_logprobs(model, [*prompt, *output_ids], temperature)
    expected = [lp[len(prompt) - 1 + j, t].item() for j, t in enumerate(output_ids)]
    return max(abs(a - b) for a, b in zip(logprobs, expected))


def sampling(max_new_tokens: int, temperature: float = 1.0, **kwargs: Any) -> SamplingConfig:
    return SamplingConfig(temperature=temperature, top_p=kwargs.pop("top_p", 1.0), top_k=kwargs.pop("top_k", -1),
                          min_p=0.0, max_new_tokens=max_new_tokens, **kwargs)


async def collect(core: TorchModel, prompt: Sequence[int], config: SamplingConfig) -> list[TokenStep]:
    return [step async for step in core.generate(prompt, config)]


# --- HTTP ---------------------------------------------------------------------------------------------


def test_generate_non_stream_stream_and_batch_have_valid_shapes(engine: tuple[TorchModel, httpx.Client],
                                                                prompts: list[list[int]]) -> None:
    core, client = engine
    assert isinstance(core, EngineModel)
    params = {"max_new_tokens": 12, "ignore_eos": True, "temperature": 0.8}
    out = post(client, input_ids=prompts[0], sampling_params=params, return_logprob=True, top_logprobs_num=3)
    meta = out["meta_info"]
    assert len(out["output_ids"]) == 12 and meta["completion_tokens"] == 12
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert all(0 <= t < core.vocab_size for t in out["output_ids"])
    for (lp, token, _), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert lp <= 0.0 and len(top) == 3 and top[0][0] >= lp
        assert [t[0] for t in top] == sorted((t[0] for t in top), reverse=True)
        assert {t[1]: t[0] for t in top}.get(token, lp) == lp  # one distribution for both
    with client.stream("POST", "/generate", json={"input_ids": prompts[1], "sampling_params": params,
                                                  "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) == 13
    batch = post(client, input_ids=prompts[:3], sampling_params=params)
    assert [len(o["output_ids"]) for o in batch] == [12, 12, 12]
    assert [o["meta_info"]["prompt_tokens"] for o in batch] == [len(p) for p in prompts[:3]]
    eos = min(core.eos_token_ids)
    forced = post(client, input_ids=prompts[0], sampling_params={"max_new_tokens": 5, "logit_bias": {str(eos): 100}},
                  return_logprob=True)
    assert forced["output_ids"] == [eos] and forced["meta_info"]["finish_reason"]["matched"] == eos
    assert forced["meta_info"]["output_token_logprobs"][0][0] == pytest.approx(0.0, abs=1e-6)


def test_greedy_is_deterministic_and_equals_transformers_generate(engine: tuple[TorchModel, httpx.Client],
                                                                  prompts: list[list[int]], reference: Any) -> None:
    from transformers import GenerationConfig

    _, client = engine
    params = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    first = post(client, input_ids=prompts[2], sampling_params=params)["output_ids"]
    assert post(client, input_ids=prompts[2], sampling_params=params)["output_ids"] == first
    config = GenerationConfig(do_sample=False, max_new_tokens=24, eos_token_id=None, pad_token_id=0)
    ids = torch.tensor([prompts[2]])
    expected = reference.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    assert first == expected[0, len(prompts[2]):].tolist()


def test_seeded_sampling_is_reproducible(engine: tuple[TorchModel, httpx.Client], prompts: list[list[int]]) -> None:
    _, client = engine

    def sample(seed: int) -> list[int]:
        params = {"max_new_tokens": 16, "ignore_eos": True, "temperature": 1.0, "top_p": 0.95, "sampling_seed": seed}
        return post(client, input_ids=prompts[0], sampling_params=params)["output_ids"]

    assert sample(7) == sample(7)
    assert len({tuple(sample(seed)) for seed in (7, 8, 9)}) > 1
    top1 = {"max_new_tokens": 16, "ignore_eos": True, "temperature": 1.0, "top_k": 1}
    greedy = {"max_new_tokens": 16, "ignore_eos": True, "temperature": 0.0}
    assert post(client, input_ids=prompts[0], sampling_params=top1)["output_ids"] == \
        post(client, input_ids=prompts[0], sampling_params=greedy)["output_ids"]


@pytest.mark.parametrize(("temperature", "truncation"), [
    (1.0, {}), (0.7, {}), (0.7, {"top_k": 20, "top_p": 0.8, "min_p": 0.05})])
def test_rollout_logprobs_match_a_full_forward_recompute_in_a_ragged_batch(
        engine: tuple[TorchModel, httpx.Client], prompts: list[list[int]], reference: Any,
        temperature: float, truncation: dict[str, Any]) -> None:
    _, client = engine
    params = {"max_new_tokens": 24, "ignore_eos": True, "temperature": temperature, **truncation}
    outputs = post(client, input_ids=prompts, sampling_params=params, return_logprob=True)  # 4 concurrent rows
    for prompt, out in zip(prompts, outputs):
        logprobs = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        assert max_gap(reference, prompt, out["output_ids"], logprobs, temperature) <= TOL


def test_input_logprobs_match_the_full_forward_and_line_up_with_the_rollout(
        engine: tuple[TorchModel, httpx.Client], prompts: list[list[int]], reference: Any) -> None:
    _, client = engine
    prompt = prompts[0]
    rollout = post(client, input_ids=prompt, sampling_params={"max_new_tokens": 10, "ignore_eos": True},
                   return_logprob=True)
    ids = prompt + rollout["output_ids"]
    k = len(prompt) - 1
    teacher = post(client, input_ids=ids, sampling_params={"max_new_tokens": 0, "temperature": 0.3},
                   return_logprob=True, logprob_start_len=k, top_logprobs_num=2)["meta_info"]
    entries = teacher["input_token_logprobs"]
    assert len(entries) == len(ids) - k and entries[0] == [None, ids[k], None]
    lp = full_logprobs(reference, ids)  # never temperature-scaled
    for j, (logprob, token, _) in enumerate(entries[1:], start=1):
        assert token == ids[k + j] and abs(logprob - lp[k + j - 1, token].item()) <= TOL
    for j, top in enumerate(teacher["input_top_logprobs"][1:], start=1):
        values, indices = lp[k + j - 1].topk(2)
        assert [t[1] for t in top] == indices.tolist()
        assert [t[0] for t in top] == pytest.approx(values.tolist(), abs=TOL)
    assert [t[1] for t in teacher["output_top_logprobs"][0]] == lp[-1].topk(2).indices.tolist()
    next_only = post(client, input_ids=ids, sampling_params={"max_new_tokens": 0}, return_logprob=True,
                     top_logprobs_num=2)["meta_info"]  # no logprob_start_len: only the next-token top-k
    assert next_only["input_token_logprobs"] == []
    assert [t[1] for t in next_only["output_top_logprobs"][0]] == lp[-1].topk(2).indices.tolist()
    assert [t[0] for t in next_only["output_top_logprobs"][0]] == pytest.approx(lp[-1].topk(2).values.tolist(), abs=TOL)
    sampled = [lp for lp, _, _ in rollout["meta_info"]["output_token_logprobs"]]
    assert [e[0] for e in entries[1:]] == pytest.approx(sampled, abs=TOL)  # entry j scores ids[k + j]


def test_update_from_disk_refuses_a_wrong_shaped_checkpoint_and_keeps_serving(
        engine: tuple[TorchModel, httpx.Client], prompts: list[list[int]], reference: Any, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    core, client = engine
    state = {name: t.detach().clone() for name, t in reference.state_dict().items() if name != "lm_head.weight"}
    state["model.layers.0.mlp.up_proj.weight"] = torch.zeros(300, 128)
    save_file(state, str(tmp_path / "model.safetensors"))
    response = client.post("/update_weights_from_disk", json={"model_path": str(tmp_path), "weight_version": "bad"})
    assert response.status_code == 400 and response.json()["success"] is False
    assert "model.layers.0.mlp.up_proj.weight" in response.json()["message"]
    assert core.weight_version == "default"
    out = post(client, input_ids=prompts[1], sampling_params={"max_new_tokens": 4, "ignore_eos": True})
    assert out["meta_info"]["weight_version"] == "default" and len(out["output_ids"]) == 4
    reference.save_pretrained(tmp_path / "good")  # the same weights: later tests still see the checkpoint
    response = client.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "good"),
                                                              "weight_version": "2"})
    assert response.json()["success"] is True, response.text
    out = post(client, input_ids=prompts[1], sampling_params={"max_new_tokens": 4, "ignore_eos": True})
    assert out["meta_info"]["weight_versions"] == [{"version": "2", "start": 0, "end": 4}]


# --- the scheduler and in-process weights (a private core, driven directly) --------------------------


def test_requests_joining_mid_flight_all_finish_exactly_and_free_their_slots(
        tiny_model_dir: Path, prompts: list[list[int]], reference: Any) -> None:
    core = TorchModel.from_pretrained(tiny_model_dir, max_batch=3)

    async def scenario() -> None:
        first = core.generate(prompts[3], sampling(40, 0.9, seed=1))
        head = [await first.__anext__() for _ in range(5)]
        later = [asyncio.ensure_future(collect(core, p, sampling(n, 0.7))) for p, n in zip(prompts, (7, 30, 19, 11))]
        dropped = core.generate(prompts[1], sampling(50))
        await dropped.__anext__()
        await dropped.__anext__()
        await dropped.aclose()  # an early close must free its slot for the waiting requests
        rest = [step async for step in first]
        results = await asyncio.gather(*later)
        assert [len(r) for r in results] == [7, 30, 19, 11]
        assert max_gap(reference, prompts[3], [s.token_id for s in head + rest],
                       [s.logprob for s in head + rest], 0.9) <= TOL
        for prompt, steps in zip(prompts, results):
            assert max_gap(reference, prompt, [s.token_id for s in steps], [s.logprob for s in steps], 0.7) <= TOL
        if core._task is not None:  # the scheduler exits once no request is left (closed rows leave first)
            await asyncio.wait_for(asyncio.shield(core._task), timeout=60)
        assert core.num_requests == 0

    asyncio.run(scenario())


def test_load_state_dict_swaps_weights_between_steps_and_tags_tokens(
        tiny_model_dir: Path, prompts: list[list[int]], reference: Any) -> None:
    core = TorchModel.from_pretrained(tiny_model_dir)
    greedy = sampling(12, 0.0)
    before = asyncio.run(collect(core, prompts[0], greedy))
    generator = torch.Generator().manual_seed(0)
    perturbed = {n: t + 0.05 * torch.randn(t.shape, generator=generator) for n, t in reference.state_dict().items()}
    core.load_state_dict(perturbed, "v1")  # its speed is measured by scripts/bench_engine.py, not asserted
    after = asyncio.run(collect(core, prompts[0], greedy))
    assert core.weight_version == "v1" and {s.weight_version for s in after} == {"v1"}
    assert [s.token_id for s in after] != [s.token_id for s in before]

    async def update_mid_request() -> list[TokenStep]:
        stream = core.generate(prompts[0], sampling(10, 1.0, seed=3))
        steps = [await stream.__anext__() for _ in range(3)]
        # The third pull woke the scheduler; its next idle wait means it has refilled the lookahead and
        # stopped (or, were it to run ahead, finished the request): then the weights change.
        waits = core.idle_waits
        while core.idle_waits == waits:
            await asyncio.sleep(0.005)
        await asyncio.to_thread(core.load_state_dict, reference.state_dict(), "v2")
        return steps + [step async for step in stream]

    steps = asyncio.run(update_mid_request())
    versions = [s.weight_version for s in steps]
    assert len(steps) == 10 and versions[:3] == ["v1"] * 3
    assert versions[3 + LOOKAHEAD:] == ["v2"] * (7 - LOOKAHEAD)  # at most LOOKAHEAD steps computed ahead
    with pytest.raises(ValueError, match="shape"):
        core.load_state_dict({**reference.state_dict(), "model.norm.weight": torch.ones(3)}, "v3")
    assert core.weight_version == "v2"


def test_register_engine_command_parses_the_flags() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    register_engine_command(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["engine", "--model", "/m", "--port", "31000", "--max-batch", "4"])
    assert (ns.model, ns.port, ns.host, ns.max_batch) == ("/m", 31000, "127.0.0.1", 4)
    assert callable(ns.fn)


# --- the prefix cache --------------------------------------------------------------------------------


def test_a_cached_prefix_gives_the_same_logprobs_and_weight_updates_flush_it(
        tiny_model_dir: Path, tokenizer: Any, reference: Any) -> None:
    """Two prompts sharing a long head: the second prefills only its tail on the first one's KV, and its
    log-probs (sampled and scored) still equal a full forward's; a weight update empties the cache, so
    nothing computed by the old weights is reused."""
    head = tokenizer.encode(" ".join(["the tools you may call are listed here"] * 20), add_special_tokens=False)
    first, second = head + tokenizer.encode(" hello", add_special_tokens=False), head + [5, 6, 7]
    cached = TorchModel.from_pretrained(tiny_model_dir)
    plain = TorchModel.from_pretrained(tiny_model_dir, prefix_cache_entries=0)
    config = sampling(12, 1.0, seed=5, top_logprobs_num=3)
    asyncio.run(collect(cached, first, config))
    assert len(cached.prefixes) == 1 and cached.prefixes.stats.hits == 0
    with_cache = asyncio.run(collect(cached, second, config))
    assert cached.prefixes.stats.hits == 1 and cached.prefixes.stats.reused_tokens == len(head)
    without = asyncio.run(collect(plain, second, config))
    assert [s.token_id for s in with_cache] == [s.token_id for s in without]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(with_cache, without)) <= 1e-5
    for a, b in zip(with_cache, without):
        assert [t for _, t in a.top_logprobs] == [t for _, t in b.top_logprobs]
        assert [v for v, _ in a.top_logprobs] == pytest.approx([v for v, _ in b.top_logprobs], abs=1e-5)
    assert max_gap(reference, second, [s.token_id for s in with_cache], [s.logprob for s in with_cache], 1.0) <= TOL
    ids = second + [s.token_id for s in with_cache]
    scores = asyncio.run(cached.score(ids, len(second), 2))  # the scorer reuses the head too
    assert cached.prefixes.stats.hits == 2
    lp = full_logprobs(reference, ids)
    expected = [lp[len(second) - 1 + j, t].item() for j, t in enumerate(ids[len(second):])]
    assert max(abs(a - b) for a, b in zip(scores.token_logprobs, expected)) <= 1e-5

    generator = torch.Generator().manual_seed(0)
    perturbed = {n: t + 0.05 * torch.randn(t.shape, generator=generator) for n, t in reference.state_dict().items()}
    cached.load_state_dict(perturbed, "v1")
    assert len(cached.prefixes) == 0  # the old weights' KV is gone
    greedy = sampling(8, 0.0)
    after = asyncio.run(collect(cached, second, greedy))
    plain.load_state_dict(perturbed, "v1")
    assert [s.logprob for s in after] == pytest.approx([s.logprob for s in asyncio.run(collect(plain, second, greedy))],
                                                       abs=1e-5)
    assert len(cached.prefixes) == 1
    cached.flush_cache()
    assert len(cached.prefixes) == 0 and cached.prefixes.stats.flushes == 2


def test_server_info_reports_the_prefix_cache_counters(engine: tuple[TorchModel, httpx.Client], tokenizer: Any) -> None:
    """``/server_info``'s ``prefix_cache`` (what scripts/bench_router_affinity.py reads from each engine):
    every prompt looked up is counted, an empty cache's too, with its tokens, so reused / prompt tokens is
    the share of prompt tokens served from the cache."""
    _, client = engine
    client.post("/flush_cache").raise_for_status()
    before = client.get("/server_info").json()["prefix_cache"]
    head = tokenizer.encode(" ".join(["the tools you may call are listed here"] * 20), add_special_tokens=False)
    for tail in ([5, 6, 7], [8, 9]):
        resp = client.post("/generate", json={"input_ids": head + tail, "sampling_params": {"max_new_tokens": 1}})
        assert resp.status_code == 200, resp.text
    after = client.get("/server_info").json()["prefix_cache"]
    delta = {k: after[k] - before[k] for k in after}
    assert (delta["lookups"], delta["hits"]) == (2, 1)
    assert (delta["prompt_tokens"], delta["reused_tokens"]) == (2 * len(head) + 5, len(head))


def test_the_engine_command_takes_the_prefix_cache_size() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    register_engine_command(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["engine", "--model", "/m"]).prefix_cache_entries == 4
    assert parser.parse_args(["engine", "--model", "/m", "--prefix-cache-entries", "32"]).prefix_cache_entries == 32
