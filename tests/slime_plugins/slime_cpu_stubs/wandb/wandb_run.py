"""Import-only: ``megatron/rl/rl_utils.py`` imports this module at import time and names ``wandb_run.Run``
in annotations; it uses W&B only when W&B is on (never in the check)."""


class Run:
    """A type name for annotations; never instantiated."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("wandb.wandb_run.Run: W&B is stubbed in the CPU integration check")
