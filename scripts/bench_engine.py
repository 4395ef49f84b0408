"""Benchmark the embedded engine core against ``transformers``' ``model.generate`` on a tiny model.

Measures decode throughput (tokens/s, prefill included) at batch 1 and batch 8 for ``TorchModel``
(concurrent ``generate`` calls, continuously batched) and for ``model.generate`` (one padded-free
batch, pure sampling at T=1, no early stop), then the in-process and from-disk weight-sync times, and
the largest |Δ log-prob| between the engine's rollout and a full-forward recompute. Runs alternate
between the two so machine noise hits both; the median of ``--repeats`` runs is reported.

    python scripts/bench_engine.py --out bench.json [--preset h128] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openclaw_rl.embedded.tiny_model import ensure_tiny_model  # noqa: E402
from openclaw_rl.engine.model import SamplingConfig, TokenStep  # noqa: E402
from openclaw_rl.engine.torch_core import TorchModel  # noqa: E402


def engine_run(core: TorchModel, prompt: list[int], batch: int, new_tokens: int) -> tuple[float, list[Any]]:
    """Wall time of ``batch`` concurrent requests of ``new_tokens`` each, and their steps."""
    config = SamplingConfig(temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, max_new_tokens=new_tokens)

    async def one() -> list[TokenStep]:
        return [step async for step in core.generate(prompt, config)]

    async def run() -> list[list[TokenStep]]:
        return list(await asyncio.gather(*(one() for _ in range(batch))))

    started = time.perf_counter()
    steps = asyncio.run(run())
    return time.perf_counter() - started, steps


def generate_run(model: Any, prompt: list[int], batch: int, new_tokens: int) -> float:
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0)
    ids = torch.tensor([prompt] * batch)
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    elapsed = time.perf_counter() - started
    assert out.shape == (batch, len(prompt) + new_tokens), out.shape
    return elapsed


def max_logprob_gap(model: Any, prompt: list[int], rollouts: list[list[TokenStep]]) -> float:
    """The trainer's view: ``log_softmax(model(prompt + response).logits)`` at the response positions."""
    gap = 0.0
    for steps in rollouts:
        ids = prompt + [s.token_id for s in steps]
        with torch.inference_mode():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        for j, step in enumerate(steps):
            gap = max(gap, abs(step.logprob - lp[len(prompt) - 1 + j, step.token_id].item()))
    return gap


def weight_sync_ms(core: TorchModel, trainer: Any, repeats: int) -> dict[str, float]:
    state = trainer.state_dict()
    in_process = []
    for i in range(repeats * 4):
        started = time.perf_counter()
        core.load_state_dict(state, f"mem-{i}")
        in_process.append(time.perf_counter() - started)
    from_disk = []
    with tempfile.TemporaryDirectory() as tmp:
        trainer.save_pretrained(tmp)
        for i in range(repeats):
            started = time.perf_counter()
            asyncio.run(core.update_weights_from_disk(tmp, f"disk-{i}"))
            from_disk.append(time.perf_counter() - started)
    return {"load_state_dict_ms": 1e3 * statistics.median(in_process),
            "update_weights_from_disk_ms": 1e3 * statistics.median(from_disk)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON results path")
    parser.add_argument("--preset", default="h128")
    parser.add_argument("--cache-dir", default=None, help="tiny-model cache (default: the usual one)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=53)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    path = ensure_tiny_model(args.preset, cache_dir=Path(args.cache_dir) if args.cache_dir else None)
    core = TorchModel.from_pretrained(path, max_batch=max(args.batches))
    reference = AutoModelForCausalLM.from_pretrained(path).float().eval()
    prompt = torch.randint(0, core.vocab_size - 16, (args.prompt_tokens,),
                           generator=torch.Generator().manual_seed(0)).tolist()

    rows: dict[str, dict[str, float]] = {}
    gap = 0.0
    for batch in args.batches:
        engine_run(core, prompt, batch, 8)  # warm up both paths
        generate_run(reference, prompt, batch, 8)
        engine_s, generate_s = [], []
        for _ in range(args.repeats):
            elapsed, rollouts = engine_run(core, prompt, batch, args.new_tokens)
            engine_s.append(elapsed)
            generate_s.append(generate_run(reference, prompt, batch, args.new_tokens))
        gap = max(gap, max_logprob_gap(reference, prompt, rollouts))
        tokens = batch * args.new_tokens
        engine_tps, generate_tps = tokens / statistics.median(engine_s), tokens / statistics.median(generate_s)
        rows[f"bs{batch}"] = {"engine_tok_s": round(engine_tps, 1), "generate_tok_s": round(generate_tps, 1),
                              "speedup": round(engine_tps / generate_tps, 2),
                              "engine_best_tok_s": round(tokens / min(engine_s), 1),
                              "generate_best_tok_s": round(tokens / min(generate_s), 1)}
    sync = {k: round(v, 3) for k, v in weight_sync_ms(core, reference, args.repeats).items()}
    core.close()

    import transformers

    result = {"preset": args.preset, "threads": torch.get_num_threads(), "prompt_tokens": args.prompt_tokens,
              "new_tokens": args.new_tokens, "repeats": args.repeats, "throughput": rows, "weight_sync": sync,
              "max_abs_logprob_diff": gap, "torch": torch.__version__, "transformers": transformers.__version__}
    print(f"{args.preset}, {result['threads']} threads, prompt {args.prompt_tokens}, {args.new_tokens} new tokens, "
          f"median of {args.repeats}")
    print(f"{'batch':>6} {'engine tok/s':>13} {'generate tok/s':>15} {'speedup':>8}")
    for name, row in rows.items():
        print(f"{name[2:]:>6} {row['engine_tok_s']:>13.0f} {row['generate_tok_s']:>15.0f} {row['speedup']:>7.2f}x")
    print(f"weight sync: load_state_dict {sync['load_state_dict_ms']:.2f} ms, "
          f"update_weights_from_disk {sync['update_weights_from_disk_ms']:.2f} ms")
    print(f"max |Δlogprob| engine vs full forward: {gap:.2e}")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
