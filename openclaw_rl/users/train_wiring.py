"""``openclaw-rl train --per-user-adapters``: per-user LoRA adapters against an external SGLang server.

Stage: wiring of trainer → adapter sync (``sglang_adapters.py``) → SGLang. The base weights stay what
the server was launched with (no ``/update_weights_from_disk``); each user's adapter is published through
``/load_lora_adapter`` under a versioned name. The server must run with LoRA enabled and a rank at least
the trainer's (checked at start: ``/server_info``'s ``enable_lora`` and ``max_lora_rank``), e.g.
``python -m sglang.launch_server --model-path M --enable-lora --max-lora-rank 8 --lora-target-modules all
--max-loaded-loras 128`` (or ``openclaw-rl engine --model M --max-lora-rank 8``).
"""

from __future__ import annotations

from typing import Any

from openclaw_rl.errors import CommandError


def check_lora_server(info: dict[str, Any], rank: int) -> None:
    if not info.get("enable_lora"):
        raise CommandError("--per-user-adapters needs a policy server that serves LoRA adapters: start SGLang with "
                           f"--enable-lora --max-lora-rank {rank} --lora-target-modules all (or `openclaw-rl engine "
                           f"--max-lora-rank {rank}`); its /server_info says enable_lora is off")
    served = info.get("max_lora_rank")
    if isinstance(served, int) and served < rank:
        raise CommandError(f"the policy server's --max-lora-rank is {served}, below --adapter-rank {rank}")


def per_user_trainer(stack: Any, cfg: Any, tcfg: Any, model: Any) -> Any:
    from openclaw_rl.embedded.user_trainer import PerUserTrainer
    from openclaw_rl.engine.adapters import lora_config

    from .sglang_adapters import SGLangAdapterSync

    check_lora_server(dict(stack.weights.info("server_info")), cfg.adapter_rank)
    lora = lora_config(cfg.adapter_rank, 2 * cfg.adapter_rank)
    settings = stack.cfg.settings
    stack.adapter_sync = SGLangAdapterSync(settings.proxy.policy_url, stack.weights.dir / "adapters", lora,
                                           api_key=settings.proxy.policy_api_key)
    return PerUserTrainer(tcfg, model, lora, load_adapter=stack.adapter_sync.load,
                          min_samples=cfg.adapter_min_samples, tokenizer=stack.tokenizer,
                          unload_adapter=stack.adapter_sync.unload)


def add_train_user_flags(p: Any) -> None:
    p.add_argument("--per-user-adapters", action="store_true",
                   help="one LoRA adapter per user on the frozen base, loaded into the server with "
                        "/load_lora_adapter and chosen per request (needs SGLang --enable-lora; docs/users.md)")
    p.add_argument("--adapter-rank", type=int, default=8, help="--per-user-adapters: LoRA rank (alpha = 2 x rank)")
    p.add_argument("--adapter-min-samples", type=int, default=1,
                   help="--per-user-adapters: samples a user's adapter trains on before it serves that user")
