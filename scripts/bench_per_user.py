"""Benchmark: two groups of simulated users with opposite hidden preferences on one `local` run.

Runs `openclaw-rl local --simulate --user-groups formal:N,casual:N` twice with the same interactions and
seed: once with one shared model (full-weight training, the mode's defaults), once with per-user LoRA
adapters (--per-user-adapters). Prints each group's preferred rate over its first and last window, writes
both runs' per-group curves into one figure and a JSON summary (docs/users.md quotes them).

    .venv/bin/python scripts/bench_per_user.py --out docs/images/per_user_adapters.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from openclaw_rl.embedded.local import MODE_DEFAULTS, LocalConfig, run_local
    from openclaw_rl.embedded.simulate_groups import plot_group_curves

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", default="formal:2,casual:2")
    ap.add_argument("--interactions", type=int, default=640)
    ap.add_argument("--mode", default="rl")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--adapter-lr", type=float, default=5e-3)  # 1e-2 rose to 84%, then collapsed (measured)
    ap.add_argument("--work-dir", default="runs/bench-per-user")
    ap.add_argument("--out", default="runs/bench-per-user/per_user_adapters.png")
    ap.add_argument("--only", choices=("shared", "per-user"), default=None)
    args = ap.parse_args()
    defaults = MODE_DEFAULTS[args.mode]
    runs, summary = {}, {"groups": args.groups, "interactions": args.interactions, "mode": args.mode,
                         "seed": args.seed, "load_average_at_start": os.getloadavg()}
    for label, per_user in (("shared model", False), ("per-user adapters", True)):
        if args.only and (args.only == "per-user") != per_user:
            continue
        cfg = LocalConfig(mode=args.mode, seed=args.seed, port=0, simulate=True, interactions=args.interactions,
                          user_groups=args.groups, per_user_adapters=per_user,
                          out_dir=f"{args.work_dir}/{'per-user' if per_user else 'shared'}",
                          rollout_batch_size=int(defaults["batch_size"]),
                          lr=args.adapter_lr if per_user else defaults["lr"], kl_coef=defaults["kl_coef"])
        started = time.monotonic()
        captured: dict = {}

        def users(url, stop, out, cfg=cfg, captured=captured):  # the group simulation, its result kept
            from openclaw_rl.embedded.local_users import LOCAL_USER_KEY
            from openclaw_rl.embedded.simulate import drive_simulation
            from openclaw_rl.embedded.simulate_groups import parse_groups, run_group_simulation

            drive_simulation(url, stop, out, run=run_group_simulation, groups=parse_groups(cfg.user_groups),
                             interactions=cfg.interactions, concurrency=cfg.concurrency, seed=cfg.seed, window=40,
                             api_key=LOCAL_USER_KEY, max_tokens=cfg.max_new_tokens)
            captured["sim"] = out.get("result")

        report = run_local(cfg, progress=False, users=users)
        sim = captured.get("sim")
        if sim is None:
            print(f"{label}: the simulation did not finish", file=sys.stderr)
            return 1
        runs[label] = sim
        summary[label] = {"steps": report.steps, "seconds": round(time.monotonic() - started, 1),
                          "group_rates_first_last": {k: [round(a, 3), round(b, 3)] for k, (a, b) in
                                                     sim.group_rates().items()},
                          "fidelity_mean_abs_diff_max_over_steps": max(report.logprob_abs_diff, default=None),
                          "load_average_at_end": os.getloadavg()}
        print(label, json.dumps(summary[label]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    plot_group_curves(runs, args.out, title=f"{args.groups}, {args.interactions} interactions, mode {args.mode}")
    Path(args.out).with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
