"""``openclaw-rl local``'s command line: its flags, its logging and run log, and the run it starts.

Stage: command line → **local** (``local.py`` runs the stack). Kept apart from the stack so the flags and
their mapping to ``LocalConfig`` read in one place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openclaw_rl.config import COMBINE_LOSSES, DISTILL_SUBSETS, HINT_SELECTIONS, teacher_source_name
from openclaw_rl.embedded.interrupts import sigterm_as_ctrl_c
from openclaw_rl.embedded.local import (
    MODE_DEFAULTS,
    TOPK_SELECT_K,
    LocalConfig,
    configure_local_logging,
    run_local,
    summary_text,
)
from openclaw_rl.embedded.local import __doc__ as local_doc
from openclaw_rl.embedded.metric_sinks import add_wandb_flag
from openclaw_rl.modes import MODES


def register_local_command(sub: Any) -> None:
    p = sub.add_parser("local", help="run the whole stack on this CPU: engine, judge, proxy, trainer",
                       description=local_doc)
    p.add_argument("--mode", choices=list(MODES), default="rl")
    p.add_argument("--simulate", action="store_true", help="drive it with simulated users and plot the learning curve")
    p.add_argument("--interactions", type=int, default=None, help="simulated replies in total (default: per mode)")
    p.add_argument("--concurrency", type=int, default=LocalConfig.concurrency, help="simulated users at once")
    p.add_argument("--preferred-style", default="", help="the simulated users' hidden preference")
    p.add_argument("--batch-size", type=int, default=None, help="samples per step (default: per mode)")
    p.add_argument("--lr", type=float, default=None, help="default: 5e-4 (rl), per-mode tuned otherwise; 2.5e-3 with --per-user-adapters")
    p.add_argument("--kl-coef", type=float, default=None, help="KL to the initial weights (low_var_kl)")
    p.add_argument("--center-rewards", action="store_true",
                   help="rl/combine: advantages r - batch mean instead of upstream's A = r (steadier when most "
                        "of a batch shares one reward)")
    p.add_argument("--distill-topk", type=int, default=0, help="opd: train the top-K reverse-KL loss")
    p.add_argument("--distill-subset", choices=DISTILL_SUBSETS, default="teacher",
                   help="opd --distill-topk: compare the teacher's top-K ids, only those also in the student's, or (with "
                        "--teacher-source trainer) the student's own top-K ids")
    p.add_argument("--teacher-url", default="", help="opd/combine: an SGLang server (the policy's tokenizer) for the "
                   "teacher log-probs, instead of the embedded frozen copy of the initial policy")
    p.add_argument("--teacher-source", default="server", type=teacher_source_name, metavar="{server,trainer}",
                   help="opd/combine/oel: server (the judge engine's frozen copy scores, the sample stores its log-probs) "
                        "or trainer (the sample stores the hinted (oel: experience-augmented) prompt ids; a frozen teacher in the trainer scores them, "
                        "upstream's OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=megatron)")
    p.add_argument("--teacher-checkpoint", default="", help="--teacher-source trainer: the teacher's checkpoint "
                   "(default: the initial policy weights; a different tokenizer is refused)")
    p.add_argument("--hint-selection", choices=HINT_SELECTIONS, default="longest",
                   help="opd/combine: which candidate hint's teacher signal a sample keeps (the rule judge gives one "
                        "hint per turn, so every rule picks it unless --judge-hints several; see openclaw_opd/selection.py)")
    p.add_argument("--judge-hints", choices=("one", "several"), default="one",
                   help="one: the rule judge's one hint per turn; several: 3 votes, each with a hint of its own kind "
                        "(precise, vague, verbose; openclaw_rl/embedded/hint_judge.py), for --hint-selection")
    p.add_argument("--combine-loss", choices=COMBINE_LOSSES, default="ppo",
                   help="combine: ppo (one PPO loss on the mixed advantage), or topk_select (GRPO + a PPO surrogate "
                        "over the teacher's top-K ids, upstream's recommended method; --distill-topk defaults to "
                        f"{TOPK_SELECT_K} then)")
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (resumes from the latest)")
    p.add_argument("--preset", default="h128", help="tiny model size: h64, h128, h256")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", choices=("openclaw", "plain"), default=None,
                   help="openclaw: the tiny model also pre-trained on OpenClaw-shaped 4-15K-token prompts, so it "
                        "answers OpenClaw (built once, ~13 min on 2 busy cores, then cached); plain: the seconds-long build that "
                        "knows only short chats (default: openclaw, plain with --simulate)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="proxy port")
    p.add_argument("--session-ttl", type=float, default=LocalConfig.session_ttl_s,
                   help="seconds a session may stay idle before its last turn is flushed without a next state")
    p.add_argument("--out-dir", default="", help="metrics, records, spool, checkpoints (default runs/local-<mode>)")
    add_wandb_flag(p)
    from .local_users import add_user_flags

    add_user_flags(p)
    p.set_defaults(fn=_cmd_local)


def wants_openclaw_model(ns: Any) -> bool:
    """`--model`, else the OpenClaw variant, except for --simulate (its users send short chats only)."""
    return (ns.model or ("plain" if ns.simulate else "openclaw")) == "openclaw"


def local_config(ns: Any) -> LocalConfig:
    """The command line's `LocalConfig`: flags left unset take the mode's tuned defaults."""
    from .local_users import default_lr

    defaults = MODE_DEFAULTS[ns.mode]
    combine_loss = getattr(ns, "combine_loss", "ppo") if ns.mode == "combine" else "ppo"
    if getattr(ns, "combine_loss", "ppo") != "ppo" and ns.mode != "combine":
        raise SystemExit("--combine-loss is a setting of --mode combine")
    topk = ns.distill_topk or (TOPK_SELECT_K if combine_loss == "topk_select" else 0)
    suffix = "-topk_select" if combine_loss == "topk_select" else ""
    return LocalConfig(
        mode=ns.mode, preset=ns.preset, seed=ns.seed, host=ns.host, port=ns.port,
        out_dir=ns.out_dir or f"runs/local-{ns.mode}{suffix}", combine_loss=combine_loss,
        rollout_batch_size=ns.batch_size or int(defaults["batch_size"]),
        lr=ns.lr if ns.lr is not None else default_lr(getattr(ns, "per_user_adapters", False), defaults["lr"]),
        kl_coef=ns.kl_coef if ns.kl_coef is not None else defaults["kl_coef"],
        center_rewards=ns.center_rewards, distill_topk=topk, max_steps=ns.max_steps,
        hint_selection=ns.hint_selection, judge_hints=getattr(ns, "judge_hints", "one"),
        distill_subset=ns.distill_subset, teacher_url=ns.teacher_url,
        teacher_source=getattr(ns, "teacher_source", "server"), teacher_checkpoint=getattr(ns, "teacher_checkpoint", ""),
        save_every=ns.save_every, simulate=ns.simulate, concurrency=ns.concurrency,
        interactions=ns.interactions or int(defaults["interactions"]),
        preferred_style=ns.preferred_style, session_ttl_s=ns.session_ttl, openclaw_model=wants_openclaw_model(ns),
        per_user_adapters=getattr(ns, "per_user_adapters", False), user_groups=getattr(ns, "user_groups", ""),
        adapter_rank=getattr(ns, "adapter_rank", 8), adapter_min_samples=getattr(ns, "adapter_min_samples", 1),
        wandb_project=ns.wandb)


def _cmd_local(ns: Any) -> int:
    from openclaw_rl.cli import ensure_port_free

    ensure_port_free(ns.host, ns.port, "--port")  # one line before the models load, not a traceback after
    configure_local_logging()
    cfg = local_config(ns)
    with sigterm_as_ctrl_c():
        report = run_local(cfg)
    print(summary_text(report))
    if report.curve_png and report.group_rates:  # --user-groups: each group's own preference
        print(f"learning curves: {report.curve_png} (preferred rate, first -> last window: " + ", ".join(
            f"{g} {a:.0%} -> {b:.0%}" for g, (a, b) in report.group_rates.items()) + ")")
    elif report.curve_png:
        print(f"learning curve: {report.curve_png} (preferred-behaviour rate {report.baseline_rate:.0%} -> "
              f"{report.final_rate:.0%} over {report.interactions} interactions; probability of the preferred "
              f"opener {report.preferred_prob_before:.0%} -> {report.preferred_prob_after:.0%})")
    if report.untrained_samples:
        from .trainer import run_has_checkpoint

        resumable = cfg.save_every > 0 and run_has_checkpoint(Path(cfg.out_dir) / "checkpoints")
        print(f"{report.untrained_samples} samples collected after the last step stay in {cfg.out_dir}/spool: " +
              ("the next run with this --out-dir resumes the latest checkpoint and trains them first" if resumable
               else "no checkpoint was saved (--save-every N), so the next run with this --out-dir starts from the "
                    "untrained model and moves them to previous/"))
    return 0
