"""``python -m openclaw_rl.bench.teacher_mismatch``: how far each teacher source is from the student's numerics.

Stage: measurement of scorer → teacher → trainer (``openclaw_opd_teacher_source``, upstream PR #85). With the
teacher's weights equal to the student's (the default teacher: the initial policy) and the same ids (prompt +
hint + the sampled response), ``teacher − student`` should be exactly 0; whatever is left is numerical
mismatch, which token-level OPD trains on as if it were signal. Per source, on the tiny model (CPU, fp32):

- ``server``: the embedded engine (``openclaw-rl engine``'s torch core behind its SGLang-compatible
  ``/generate``) asked through ``teacher_signal`` exactly as the scorer asks it (at T != 1 its untempered
  log-probs are rescaled from its top-20, ``openclaw_opd/teacher.py``);
- ``trainer``: the trainer's frozen teacher (``openclaw_rl/embedded/frozen_teacher.py``);
- ``student``: the trainer's own forward (what the loss uses as the student), on the same ids;
- ``fp64``: a float64 copy of the model, plain full forward, ``log_softmax(logits / T)`` in float64.

Prints mean and max |a − b| over all response tokens for each pair, per temperature, and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
from types import SimpleNamespace
from typing import Any

import torch


def _pairs(values: dict[str, list[torch.Tensor]]) -> dict[str, dict[str, float]]:
    out = {}
    for a, b in (("server", "student"), ("trainer", "student"), ("server", "fp64"), ("trainer", "fp64"),
                 ("student", "fp64")):
        d = torch.cat([(x.double() - y.double()).abs() for x, y in zip(values[a], values[b], strict=True)])
        out[f"{a} vs {b}"] = {"mean_abs": float(d.mean()), "max_abs": float(d.max())}
    return out


async def _server_scores(url: str, tokenizer: Any, turns: list[Any], hints: list[str]) -> list[torch.Tensor]:
    import httpx

    from openclaw_opd.teacher import teacher_signal
    from openclaw_rl.chat import ChatRenderer
    from openclaw_rl.config import JudgeSettings
    from openclaw_rl.judge import JudgeClient

    renderer = ChatRenderer(tokenizer)
    async with httpx.AsyncClient(timeout=60.0, trust_env=False) as http:
        judge = JudgeClient(http, JudgeSettings(url=url), tokenizer=tokenizer, vocab_size=len(tokenizer))
        signals = [await teacher_signal(t, h, judge, renderer) for t, h in zip(turns, hints)]
    for s in signals:
        if 0 in s.mask:
            raise RuntimeError("the engine left a position unscored")
    return [torch.tensor(s.log_probs, dtype=torch.float64) for s in signals]


def measure(n_samples: int = 16, n_new: int = 32, temperatures: tuple[float, ...] = (1.0, 0.7), preset: str = "h128",
            seed: int = 0) -> dict[str, Any]:
    from array import array

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openclaw_opd.teacher import hinted_prompt_ids
    from openclaw_rl.chat import ChatRenderer
    from openclaw_rl.embedded import task
    from openclaw_rl.embedded.frozen_teacher import FrozenTeacher
    from openclaw_rl.embedded.tiny_model import ensure_tiny_model
    from openclaw_rl.embedded.trainer import sequence_logprobs
    from openclaw_rl.engine.app import make_engine_app
    from openclaw_rl.engine.model import sample_tokens
    from openclaw_rl.engine.torch_core import TorchModel
    from openclaw_rl.servers import BackgroundServer

    model_dir = ensure_tiny_model(preset, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    renderer = ChatRenderer(tokenizer)
    student = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()  # as the trainer holds it
    teacher = FrozenTeacher(copy.deepcopy(student))
    fp64 = copy.deepcopy(student).double().eval()
    rng = random.Random(seed)
    requests = rng.sample(task.REQUESTS, n_samples)
    hint = task.STYLES[task.DEFAULT_STYLE].instruction  # what the rule judge gives as the hint
    policy = TorchModel.from_pretrained(str(model_dir), seed=seed)
    engine = TorchModel.from_pretrained(str(model_dir), seed=seed + 1)
    results: dict[str, Any] = {"model": model_dir.name, "samples": n_samples, "response_tokens": n_new,
                               "hint": hint, "load_average": os.getloadavg(), "temperatures": {}}
    try:
        with BackgroundServer(make_engine_app(engine, tokenizer, served_model_name="teacher",
                                              model_path=str(model_dir))) as server:
            for temperature in temperatures:
                turns, hints, tokens, lengths = [], [], [], []
                for i, req in enumerate(requests):
                    messages = [{"role": "user", "content": req.text}]
                    _, prompt = renderer.render(messages)
                    ids, lps = asyncio.run(sample_tokens(policy, list(prompt), n_new, temperature, seed * 1000 + i))
                    gen = SimpleNamespace(response_ids=array("l", ids), response_logprobs=array("d", lps))
                    turn = SimpleNamespace(generation=gen, messages=messages, tools=None,
                                           sampling_temperature=temperature)
                    turns.append(turn)
                    hints.append(hint)
                    tokens.append(torch.tensor(hinted_prompt_ids(turn, hint, renderer) + ids, dtype=torch.long))
                    lengths.append(len(ids))
                args = SimpleNamespace(rollout_temperature=temperature, qkv_format="thd")
                values: dict[str, list[torch.Tensor]] = {
                    "server": asyncio.run(_server_scores(server.url, tokenizer, turns, hints)),
                    "trainer": teacher.score(args, tokens, lengths)[0],
                    "student": sequence_logprobs(student, {"unconcat_tokens": tokens, "response_lengths": lengths,
                                                           "total_lengths": [len(t) for t in tokens]}, args),
                    "fp64": [],
                }
                with torch.no_grad():
                    for t, r in zip(tokens, lengths):
                        logits = fp64(input_ids=t.unsqueeze(0)).logits[0, len(t) - r - 1:len(t) - 1] / temperature
                        values["fp64"].append(torch.log_softmax(logits, dim=-1).gather(
                            -1, t[len(t) - r:].unsqueeze(-1)).squeeze(-1))
                results["temperatures"][str(temperature)] = _pairs(values)
    finally:
        policy.close()
        engine.close()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--tokens", type=int, default=32, help="response tokens sampled per sample")
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    p.add_argument("--seed", type=int, default=0)
    ns = p.parse_args(argv)
    out = measure(ns.samples, ns.tokens, tuple(ns.temperatures), seed=ns.seed)
    print(json.dumps(out, indent=2))
    for temperature, pairs in out["temperatures"].items():
        print(f"T = {temperature}")
        for name, d in pairs.items():
            print(f"  {name:20s} mean {d['mean_abs']:.2e}  max {d['max_abs']:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
