"""``openclaw-rl local`` with many people: the per-user switches of the local stack, in one place.

Stage: local stack wiring (proxy settings, engine, trainer, simulated users). ``--user-groups
formal:2,casual:2`` drives the run with groups of simulated users of opposite preferences, each user
named by the ``X-User-Id`` header of the run's trusted key; ``--per-user-adapters`` gives each user a
LoRA adapter on the frozen base (``user_trainer.py``), served by the embedded engine's adapter bank
(``engine/adapters.py``) and chosen per request by the proxy (``users/adapters.py``). Without
``--per-user-adapters`` the same users share one model: the baseline of the benchmark in docs/users.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .local import LocalConfig, LocalStack

LOCAL_USER_KEY = "local"  # the run's one trusted key when users are named by header
ADAPTER_LR = 2.5e-3
"""`local --per-user-adapters`' learning rate unless --lr is given (the full-weight 5e-4 barely moves a rank-8
LoRA in a run). Measured on the tiny model (docs/users.md): at 5e-3 a user's adapter, after reaching ~100%,
drifts (the policy entropy climbs through the run) and can collapse into babble; 1e-2 collapses sooner; at
2.5e-3 the entropy falls through the run and both groups still pass 90% within ~100 of their replies."""


def default_lr(per_user: bool, mode_lr: float) -> float:
    """The learning rate of a `local` run when --lr is not given: the adapters' own, or the mode's."""
    return ADAPTER_LR if per_user else mode_lr


def user_settings(cfg: LocalConfig) -> dict[str, Any]:
    """Proxy settings of a run with several users: a trusted key (the header names the user), adapters."""
    if not (cfg.per_user_adapters or cfg.user_groups):
        return {}
    keys = list(cfg.api_keys) or [LOCAL_USER_KEY]
    return {"proxy_api_keys": keys, "proxy_trusted_user_keys": keys, "proxy_per_user_adapters": cfg.per_user_adapters}


def make_user_trainer(stack: LocalStack, tcfg: Any, trainer_model: Any) -> Any:
    """The per-user trainer over the trainer's copy of the base; the policy engine serves the adapters."""
    from openclaw_rl.engine.adapters import lora_config

    from .user_trainer import PerUserTrainer

    cfg = stack.cfg
    lora = lora_config(cfg.adapter_rank, 2 * cfg.adapter_rank)
    stack.policy.enable_lora(lora)
    trainer = PerUserTrainer(tcfg, trainer_model, lora, load_adapter=stack.policy.load_adapter,
                             directory=stack.runtime.proxy.service.adapters, min_samples=cfg.adapter_min_samples,
                             tokenizer=stack.tokenizer, unload_adapter=stack.policy.unload_adapter)
    admit_user_deletion(stack.runtime.proxy, trainer)
    return trainer


def admit_user_deletion(proxy: Any, trainer: Any) -> None:
    """``DELETE /v1/users/{user}`` on the run's proxy also deletes the user's adapter here (users/deletion.py)."""
    from pathlib import Path

    if trainer.cfg.ckpt_dir:
        proxy.user_admin.ckpt_dir = Path(trainer.cfg.ckpt_dir)
    proxy.user_admin.trainer_hooks.append(trainer.delete_user)


def simulate_groups(stack: LocalStack, cfg: LocalConfig, out: dict[str, Any]) -> None:
    from .simulate import drive_simulation
    from .simulate_groups import parse_groups, run_group_simulation

    drive_simulation(stack.url, stack.stop_event, out, run=run_group_simulation, groups=parse_groups(cfg.user_groups),
                     interactions=cfg.interactions, concurrency=cfg.concurrency, seed=cfg.seed, window=40,
                     api_key=(list(cfg.api_keys) or [LOCAL_USER_KEY])[0], max_tokens=cfg.max_new_tokens)


def add_user_flags(p: Any) -> None:
    p.add_argument("--per-user-adapters", action="store_true",
                   help="one LoRA adapter per user (API key, or a trusted key's X-User-Id) on the frozen base; a "
                        "user gets the base model until their adapter has trained (docs/users.md)")
    p.add_argument("--user-groups", default="",
                   help="with --simulate: groups of simulated users and their hidden styles, e.g. formal:2,casual:2 "
                        "(interleaved on one run; each group's curve is plotted)")
    p.add_argument("--adapter-rank", type=int, default=8, help="--per-user-adapters: LoRA rank (alpha = 2 x rank); their --lr defaults to "
                        f"{ADAPTER_LR:g}")
    p.add_argument("--adapter-min-samples", type=int, default=1,
                   help="--per-user-adapters: samples a user's adapter trains on before it serves that user")
