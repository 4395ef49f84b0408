"""Benchmark: two groups of simulated users with opposite hidden preferences on one `local` run.

For each seed, runs `openclaw-rl local --simulate --user-groups formal:N,casual:N` twice with the same
interactions and seed: once with one shared model (full-weight training, the mode's defaults), once with
per-user LoRA adapters (--per-user-adapters, `local`'s adapter learning rate unless --adapter-lr). Prints
each group's preferred rate over its first and last window, writes every seed's both runs' per-group curves
into one figure (a panel per seed) and a JSON summary (docs/users.md quotes them).

    .venv/bin/python scripts/bench_per_user.py --seeds 0,1,2,3 --interactions 960 \\
        --out docs/images/per_user_adapters.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def window_counts(sim, window: int) -> dict[str, list[int]]:
    """Per group: [preferred replies, replies] in its last window of uninstructed replies."""
    return {style: [sum(r.matches[-window:]), len(r.matches[-window:])] for style, r in sim.groups.items()}


def run_one(args, seed: int, per_user: bool, work_dir: str):
    from openclaw_rl.embedded.local import MODE_DEFAULTS, LocalConfig, run_local
    from openclaw_rl.embedded.local_users import default_lr

    defaults = MODE_DEFAULTS[args.mode]
    lr = args.adapter_lr if (per_user and args.adapter_lr) else default_lr(per_user, defaults["lr"])
    cfg = LocalConfig(mode=args.mode, seed=seed, port=0, simulate=True, interactions=args.interactions,
                      user_groups=args.groups, per_user_adapters=per_user,
                      out_dir=f"{work_dir}/{'per-user' if per_user else 'shared'}",
                      rollout_batch_size=int(defaults["batch_size"]), lr=lr, kl_coef=defaults["kl_coef"],
                      center_rewards=args.center_rewards and per_user)
    started, load_start = time.monotonic(), os.getloadavg()
    captured: dict = {}

    def users(url, stop, out, cfg=cfg, captured=captured):  # the group simulation, its result kept
        from openclaw_rl.embedded.local_users import LOCAL_USER_KEY
        from openclaw_rl.embedded.simulate import drive_simulation
        from openclaw_rl.embedded.simulate_groups import parse_groups, run_group_simulation

        drive_simulation(url, stop, out, run=run_group_simulation, groups=parse_groups(cfg.user_groups),
                         interactions=cfg.interactions, concurrency=cfg.concurrency, seed=cfg.seed,
                         window=args.window, api_key=LOCAL_USER_KEY, max_tokens=cfg.max_new_tokens)
        captured["sim"] = out.get("result")

    report = run_local(cfg, progress=False, users=users)
    sim = captured.get("sim")
    if sim is None:
        return None, None
    entropy = [json.loads(line).get("train/entropy_loss", 0.0) for line in Path(report.metrics_path).read_text().splitlines()]
    quarter = max(len(entropy) // 4, 1)
    summary = {"lr": lr, "steps": report.steps, "seconds": round(time.monotonic() - started, 1),
               "group_rates_first_last": {k: [round(a, 3), round(b, 3)] for k, (a, b) in sim.group_rates().items()},
               "last_window_counts": window_counts(sim, args.window),
               "entropy_by_quarter": [round(sum(entropy[i * quarter:(i + 1) * quarter]) / quarter, 3)
                                      for i in range(4)],
               "fidelity_mean_abs_diff_max_over_steps": max(report.logprob_abs_diff, default=None),
               "load_average_at_start": [round(x, 2) for x in load_start],
               "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
    return sim, summary


def main() -> int:
    from openclaw_rl.embedded.simulate_groups import plot_group_panels

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", default="formal:2,casual:2")
    ap.add_argument("--interactions", type=int, default=960)
    ap.add_argument("--mode", default="rl")
    ap.add_argument("--seeds", default="0", help="comma-separated; every seed runs both setups")
    ap.add_argument("--window", type=int, default=40, help="the group's first/last uninstructed replies rated")
    ap.add_argument("--adapter-lr", type=float, default=None, help="default: local's (ADAPTER_LR)")
    ap.add_argument("--center-rewards", action="store_true", help="per-user adapters: A = r - the user's batch mean")
    ap.add_argument("--work-dir", default="runs/bench-per-user")
    ap.add_argument("--out", default="runs/bench-per-user/per_user_adapters.png")
    ap.add_argument("--only", choices=("shared", "per-user"), default=None)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    panels: dict = {}
    summary: dict = {"groups": args.groups, "interactions": args.interactions, "mode": args.mode, "window": args.window,
                     "seeds": {}}
    for seed in seeds:
        runs, per_seed = {}, {}
        for label, per_user in (("shared model", False), ("per-user adapters", True)):
            if args.only and (args.only == "per-user") != per_user:
                continue
            sim, result = run_one(args, seed, per_user, f"{args.work_dir}/seed-{seed}")
            if sim is None:
                print(f"seed {seed}, {label}: the simulation did not finish", file=sys.stderr)
                return 1
            runs[label], per_seed[label] = sim, result
            print(f"seed {seed}", label, json.dumps(result), flush=True)
        panels[f"seed {seed}"] = runs
        summary["seeds"][str(seed)] = per_seed
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # written after every seed: a partial run is kept
        plot_group_panels(panels, args.out, title=f"{args.groups}, {args.interactions} interactions, mode "
                          f"{args.mode}: shared model (solid) vs per-user adapters (dashed)")
        Path(args.out).with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
