"""Weights & Biases stand-in: importable, never used (the check runs with USE_WANDB=0)."""


def __getattr__(name):
    raise RuntimeError(f"wandb.{name}: W&B is stubbed in the CPU integration check")
