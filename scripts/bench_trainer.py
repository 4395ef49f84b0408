"""Seconds per step and peak RSS of the embedded trainer on long samples (OpenClaw prompts are ~15K tokens).

Each (tokens, batch) configuration runs in a fresh subprocess, so its peak RSS (ru_maxrss) is its own.
One step = the trainer's real `train()` (old log-probs, per-sample forward/backward, AdamW, fidelity):
the samples carry the served weights' version label, as `local`'s do, so the fidelity score is included.
The machine's load average is printed beside every figure (on a shared machine the seconds depend on it).

    python scripts/bench_trainer.py                      # 1K, 8K and 25K tokens; batches 1 and 8
    python scripts/bench_trainer.py --configs 1000x8 25000x1 --threads 2 --out runs/bench/trainer.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_CONFIGS = ("1000x1", "1000x8", "8000x1", "8000x8", "25000x1", "25000x8")


def one(tokens: int, batch: int, response: int, threads: int, preset: str) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from openclaw_rl.embedded.tiny_model import BPE_VOCAB_SIZE, PRESETS
    from openclaw_rl.embedded.trainer import EmbeddedTrainer, TrainerConfig
    from openclaw_rl.samples import TrainingSample

    torch.set_num_threads(threads)
    torch.manual_seed(0)  # the tiny model's architecture at random weights: cost does not depend on them
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=BPE_VOCAB_SIZE + 9, dtype="float32", **PRESETS[preset]))
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size - 16
    samples = []
    for i in range(batch):
        ids = torch.randint(0, vocab, (tokens,), generator=gen).tolist()
        prompt, reply = ids[:-response], ids[-response:]
        samples.append(TrainingSample(session_id=f"b{i}", turn=1, kind="rl", prompt_ids=prompt, response_ids=reply,
                                      rollout_log_probs=[-1.0] * response, loss_mask=[1] * response,
                                      reward=(-1.0) ** i, metadata={"weight_version": "default"}))
    trainer = EmbeddedTrainer(TrainerConfig(mode="rl"), model, sync=lambda sd, v: None)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    metrics = trainer.train(samples).metrics
    seconds = time.perf_counter() - t0
    assert metrics["train/rollout_fidelity_samples"] == batch  # the fidelity score is part of the measured step
    return {"tokens": tokens, "batch": batch, "seconds_per_step": round(seconds, 2),
            "seconds_per_sample": round(seconds / batch, 2), "peak_rss_mb": round(resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss / 1024), "rss_before_step_mb": round(rss_before), "threads": threads,
            "load_avg_1m_before": round(load_before, 1), "load_avg_1m_after": round(os.getloadavg()[0], 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="*", default=list(DEFAULT_CONFIGS), help="TOKENSxBATCH")
    p.add_argument("--response", type=int, default=64, help="response tokens per sample")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--preset", default="h128")
    p.add_argument("--out", default="runs/bench/trainer.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.child:
        tokens, batch = map(int, ns.child.split("x"))
        print(json.dumps(one(tokens, batch, ns.response, ns.threads, ns.preset)))
        return
    rows = []
    for config in ns.configs:
        out = subprocess.run([sys.executable, __file__, "--child", config, "--response", str(ns.response),
                              "--threads", str(ns.threads), "--preset", ns.preset],
                             capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{row['tokens']:>6} tokens x {row['batch']}: {row['seconds_per_step']:8.2f} s/step "
              f"({row['seconds_per_sample']:.2f} s/sample), peak RSS {row['peak_rss_mb']} MB "
              f"(model loaded: {row['rss_before_step_mb']} MB), {row['threads']} thread(s), load average "
              f"{row['load_avg_1m_before']} -> {row['load_avg_1m_after']}", flush=True)
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
