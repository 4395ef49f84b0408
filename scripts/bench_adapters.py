"""Benchmark: 100 LoRA adapters on the embedded engine (docs/performance.md, "Per-user adapters").

Measures, on the tiny model: the memory one adapter adds (its tensors, and the process RSS growth over
loading all of them), the time to add and to replace (swap) one adapter, and the latency of a request
without LoRA, with LoRA enabled but no adapter, with one adapter for the whole batch, and with a
different adapter on every row of the batch. Prints one JSON object.

    .venv/bin/python scripts/bench_adapters.py --adapters 100 --batch 8 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def delta_strategies(core, names: list[str], steps: int = 200) -> dict:
    """The LoRA deltas of one decode step (batch of len(names) rows, one token each, every LoRA layer of the
    model) computed two ways: grouped by adapter (what PEFT's mixed batches do: one pass per distinct
    adapter) and gathered per row (stacked A/B indexed by each row's adapter, two ``bmm``). Microseconds."""
    import torch

    layers = []
    for _, layer in core.adapters.layers:
        a = torch.stack([layer.lora_A[n].weight for n in names])  # [B, r, in]
        b = torch.stack([layer.lora_B[n].weight for n in names])  # [B, out, r]
        layers.append((a, b, float(layer.scaling[names[0]])))
    xs = [torch.randn(len(names), 1, a.shape[2]) for a, _, _ in layers]

    def grouped() -> None:
        for (a, b, s), x in zip(layers, xs):
            out = torch.zeros(x.shape[0], 1, b.shape[1])
            for i in range(len(names)):  # distinct adapters: one pass each over its rows
                rows = torch.tensor([i])
                out[rows] += (x[rows] @ a[i].T) @ b[i].T * s

    def gathered() -> None:
        for (a, b, s), x in zip(layers, xs):
            torch.bmm(torch.bmm(x, a.transpose(1, 2)), b.transpose(1, 2)) * s

    result = {}
    with torch.inference_mode():
        for name, fn in (("grouped", grouped), ("gathered_bmm", gathered)):
            fn()
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            result[f"lora_delta_us_per_step_{name}"] = (time.perf_counter() - t0) / steps * 1e6
    return result


def main() -> int:
    import torch
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from openclaw_rl.embedded.tiny_model import ensure_tiny_model
    from openclaw_rl.engine.adapters import lora_config
    from openclaw_rl.engine.model import SamplingConfig
    from openclaw_rl.engine.torch_core import TorchModel

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h128")
    ap.add_argument("--adapters", type=int, default=100)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model_dir = ensure_tiny_model(args.preset, seed=0)
    lora = lora_config(args.rank, 2 * args.rank)
    torch.manual_seed(0)
    donor = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), lora, adapter_name="d")
    states = []
    for _ in range(args.adapters):
        for name, p in donor.named_parameters():
            if "lora_" in name:
                torch.nn.init.normal_(p, std=0.05)
        states.append({k: v.detach().clone() for k, v in get_peft_model_state_dict(donor, adapter_name="d").items()})
    prompt = list(range(10, 60))

    def latency(core: TorchModel, adapters: list[str | None]) -> float:
        """Mean seconds per request of one concurrent batch."""
        async def one(adapter: str | None, seed: int) -> float:
            t0 = time.perf_counter()
            cfg = SamplingConfig(temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, max_new_tokens=args.new_tokens,
                                 seed=seed, adapter=adapter)
            async for _ in core.generate(prompt, cfg):
                pass
            return time.perf_counter() - t0

        async def batch() -> list[float]:
            return list(await asyncio.gather(*(one(a, i) for i, a in enumerate(adapters))))
        return statistics.mean(asyncio.run(batch()))

    out: dict = {"preset": args.preset, "rank": args.rank, "adapters": args.adapters, "batch": args.batch,
                 "new_tokens": args.new_tokens, "load_average_at_start": os.getloadavg()}
    plain = TorchModel.from_pretrained(str(model_dir), max_batch=args.batch)
    core = TorchModel.from_pretrained(str(model_dir), max_batch=args.batch)
    core.enable_lora(lora)
    before = rss_mb()
    adds = []
    names = [f"user{i:03d}" for i in range(args.adapters)]
    for name, state in zip(names, states):
        t0 = time.perf_counter()
        core.load_adapter(name, state, "v1")
        adds.append(time.perf_counter() - t0)
    out["rss_mb_growth_per_adapter"] = (rss_mb() - before) / args.adapters
    out["adapter_tensor_bytes"] = core.adapters.adapter_bytes(names[0])
    swaps = []
    for name, state in zip(names, reversed(states)):
        t0 = time.perf_counter()
        core.load_adapter(name, state, "v2")
        swaps.append(time.perf_counter() - t0)
    out["add_ms_median"] = 1000 * statistics.median(adds)
    out["swap_ms_median"] = 1000 * statistics.median(swaps)
    out["swap_ms_max"] = 1000 * max(swaps)
    # round-robin, so that the machine's load (shared, changing) falls on every configuration alike
    configs = {"no_lora": (plain, [None] * args.batch), "lora_base_rows": (core, [None] * args.batch),
               "one_adapter_whole_batch": (core, [names[0]] * args.batch),
               "distinct_adapter_per_row": (core, names[:args.batch])}
    times: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(args.rounds):
        for key, (c, adapters) in configs.items():
            times[key].append(latency(c, adapters))
    for key, values in times.items():
        out[f"latency_s_{key}_median"] = statistics.median(values)
    base = out["latency_s_no_lora_median"]
    for key in configs:
        out[f"ratio_{key}_vs_no_lora"] = out[f"latency_s_{key}_median"] / base
    out.update(delta_strategies(core, names[:args.batch]))
    plain.close()
    core.close()
    out["load_average_at_end"] = os.getloadavg()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
