"""Weights & Biases stand-in: importable, never used (the check runs with USE_WANDB=0).

Any attribute raises AttributeError (not another error): ``from wandb import wandb_run`` (Megatron-LM
1dcf0dafa884's ``megatron/rl/rl_utils.py``, imported by ``megatron.training``) then finds the import-only
submodule next to this file.
"""


def __getattr__(name):
    raise AttributeError(f"wandb.{name}: W&B is stubbed in the CPU integration check")
