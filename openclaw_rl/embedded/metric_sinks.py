"""Where a training step's metrics go besides ``metrics.jsonl``: TensorBoard and Weights & Biases.

Stage: trainer → **metric sinks**. The names are Slime's (``train/loss``, ``rollout/reward_mean``, …), so a
run of ``local``/``train`` and a Slime run plot side by side. TensorBoard is written whenever the
``tensorboard`` package is installed (the ``local`` extra brings it): event files under the run's
``tensorboard/``. W&B only when asked (``--wandb``) and ``wandb`` imports; it honours the usual
``WANDB_MODE``/``WANDB_API_KEY`` environment. A sink that fails is logged once and turned off: metrics
are an observation, and a dead W&B connection must not stop training.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class WandbConfig:
    project: str = "openclaw_rl"
    run_name: str = ""
    group: str = ""
    dir: str = ""
    config: dict[str, Any] | None = None


def wandb_config(project: str, command: str, out_dir: str) -> WandbConfig | None:
    """``--wandb [PROJECT]`` as a config: None when not asked for (an empty project)."""
    if not project:
        return None
    return WandbConfig(project=project, group=command, dir=out_dir)


def add_wandb_flag(parser: Any) -> None:
    parser.add_argument("--wandb", nargs="?", const="openclaw_rl", default="", metavar="PROJECT",
                        help="also log the step metrics to Weights & Biases (project default openclaw_rl; needs "
                             "the wandb package; WANDB_MODE=offline keeps them local)")


def tensorboard_writer(directory: str) -> Any:
    """A ``SummaryWriter`` on ``directory``, or None when TensorBoard is not installed."""
    if not directory:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.info("tensorboard is not installed (pip install 'openclaw-rl[local]'); metrics go to metrics.jsonl only")
        return None
    return SummaryWriter(directory)


def wandb_run(cfg: WandbConfig | None) -> Any:
    """A W&B run, or None when not asked for or ``wandb`` is not importable."""
    if cfg is None:
        return None
    try:
        import wandb
    except ImportError:
        log.warning("--wandb: the wandb package is not installed (pip install wandb); metrics are not sent to W&B")
        return None
    kwargs: dict[str, Any] = {"project": cfg.project, "config": cfg.config or {}}
    if cfg.run_name:
        kwargs["name"] = cfg.run_name
    if cfg.group:
        kwargs["group"] = cfg.group
    if cfg.dir:
        kwargs["dir"] = cfg.dir
    try:
        return wandb.init(**kwargs)
    except Exception as e:
        log.warning("--wandb: W&B did not start (%s: %s); metrics are not sent to W&B", type(e).__name__, e)
        return None


class MetricSinks:
    def __init__(self, tensorboard_dir: str = "", wandb: WandbConfig | None = None):
        self.tb = tensorboard_writer(tensorboard_dir)
        self.wandb = wandb_run(wandb)

    def write(self, metrics: dict[str, float], step: int) -> None:
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tb is not None:
            try:
                for k, v in scalars.items():
                    self.tb.add_scalar(k, v, step)
                self.tb.flush()
            except Exception:
                log.exception("tensorboard write failed; tensorboard is off for the rest of the run")
                self.tb = None
        if self.wandb is not None:
            try:
                self.wandb.log({**scalars, "train/step": step}, step=step)
            except Exception:
                log.exception("W&B log failed; W&B is off for the rest of the run")
                self.wandb = None

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            try:
                self.wandb.finish()
            except Exception:
                log.exception("W&B finish failed")
