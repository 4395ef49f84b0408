"""The embedded single-process trainer: Slime's loop semantics on one CPU, with the same loss code.

Stage: rollout → **trainer** → weight sync → engine. Per step: take a batch from the proxy runtime
(while the *next* batch is already being collected, Slime's ``train_async`` shape), build the batch
dict Slime's Megatron actor would build (GRPO reward broadcast, teacher fields, recomputed old
log-probs), call the mode's loss function from ``slime_plugins`` / ``openclaw_*`` — the very functions
the Slime path uses — step AdamW, push the new weights into the engine in-process, acknowledge the
batch so it leaves the spool, and log. Deliberately absent: data/tensor parallelism, micro-batching.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from openclaw_rl.samples import TrainingSample
from slime_plugins.openclaw.policy_math import grpo_advantages, make_sum_of_sample_mean

log = logging.getLogger(__name__)


# --- configuration ------------------------------------------------------------------------------------


@dataclass
class TrainerConfig:
    mode: str = "rl"  # a name in openclaw_rl.modes.MODES: picks the loss (loss_for)
    rollout_batch_size: int = 8  # samples per optimizer step (Slime's --rollout-batch-size)
    lr: float = 5e-4  # tiny models need a large step (Slime's scripts use 1e-5 for 4B models); 2e-3 collapses
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eps_clip: float = 0.2
    eps_clip_high: float = 0.28
    entropy_coef: float = 0.0
    kl_coef: float = 0.0  # > 0: KL to the initial weights (low_var_kl), Slime's --use-kl-loss --kl-loss-coef
    rollout_temperature: float = 1.0  # must equal the proxy's, so trainer and rollout log-probs agree
    distill_topk: int = 0  # opd: K > 0 trains the top-K reverse-KL loss instead of token-level OPD
    w_rl: float = 1.0
    w_opd: float = 1.0
    save_every: int = 0  # checkpoint every N steps (0 = never)
    ckpt_dir: str = ""
    metrics_path: str = ""  # JSONL, one line per step
    tensorboard_dir: str = ""
    seed: int = 0

    def slime_args(self) -> SimpleNamespace:
        """The attributes Slime's ``args`` carries that the loss functions read."""
        return SimpleNamespace(eps_clip=self.eps_clip, eps_clip_high=self.eps_clip_high, eps_clip_c=None,
                               entropy_coef=self.entropy_coef, use_kl_loss=self.kl_coef > 0,
                               kl_loss_coef=self.kl_coef,
                               kl_loss_type="low_var_kl", rollout_temperature=self.rollout_temperature,
                               use_rollout_logprobs=False, distill_topk=self.distill_topk,
                               openclaw_combine_w_rl=self.w_rl, openclaw_combine_w_opd=self.w_opd,
                               advantage_estimator="grpo", qkv_format="thd")


def loss_for(cfg: TrainerConfig) -> Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """The loss each mode trains with, exactly as its Slime launch script configures it (``MODES``)."""
    from openclaw_rl.modes import get_mode, resolve

    return resolve(get_mode(cfg.mode).embedded_loss)


# --- batch ----------------------------------------------------------------------------------------------


def build_batch(samples: list[TrainingSample]) -> dict[str, Any]:
    """The per-sample tensors Slime's actor hands a loss (``_get_rollout_data`` + advantages)."""
    tokens = [torch.tensor(s.tokens, dtype=torch.long) for s in samples]
    response_lengths = [s.response_length for s in samples]
    batch: dict[str, Any] = {
        "unconcat_tokens": tokens,
        "total_lengths": [len(t) for t in tokens],
        "response_lengths": response_lengths,
        "loss_masks": [torch.tensor(s.loss_mask, dtype=torch.int32) for s in samples],
        "rollout_log_probs": [torch.tensor(s.rollout_log_probs, dtype=torch.float32) for s in samples],
        # --advantage-estimator grpo --disable-rewards-normalization: A_t = r on every response token
        "advantages": grpo_advantages(torch.tensor([s.reward for s in samples]), response_lengths),
        "rewards": [s.reward for s in samples],
    }
    if samples and all(s.teacher_log_probs is not None for s in samples):
        batch["teacher_log_probs"] = [torch.tensor(s.teacher_log_probs, dtype=torch.float32) for s in samples]
    if samples and all(s.teacher_topk_log_probs is not None for s in samples):
        batch["teacher_topk_log_probs"] = [torch.tensor(s.teacher_topk_log_probs, dtype=torch.float32).reshape(
            s.response_length, -1) for s in samples]
        batch["teacher_topk_indices"] = [torch.tensor(s.teacher_topk_indices, dtype=torch.long).reshape(
            s.response_length, -1) for s in samples]
    batch["returns"] = batch["advantages"]
    return batch


def packed_logits(model: torch.nn.Module, tokens: list[torch.Tensor]) -> torch.Tensor:
    """One right-padded forward pass, re-packed as Slime's [1, sum(total_lengths), V] layout."""
    longest = max(len(t) for t in tokens)
    ids = torch.zeros(len(tokens), longest, dtype=torch.long)
    mask = torch.zeros(len(tokens), longest, dtype=torch.long)
    for i, t in enumerate(tokens):
        ids[i, : len(t)] = t
        mask[i, : len(t)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits.float()  # (B, L, V)
    return torch.cat([logits[i, : len(t)] for i, t in enumerate(tokens)]).unsqueeze(0)


# --- the trainer ----------------------------------------------------------------------------------------


@dataclass
class StepResult:
    step: int
    metrics: dict[str, float] = field(default_factory=dict)


class EmbeddedTrainer:
    def __init__(self, cfg: TrainerConfig, model: torch.nn.Module, *, sync: Callable[[dict, str], None],
                 tokenizer: Any = None):
        torch.manual_seed(cfg.seed)
        self.cfg, self.model, self.sync_fn, self.tokenizer = cfg, model, sync, tokenizer
        self.model.train()
        self.args = cfg.slime_args()
        self.loss_fn = loss_for(cfg)
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                           betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
        self.step = 0
        # The weights the engine serves right now, and their version label: rollout log-probs of samples
        # sampled by exactly these weights are recomputed with them, which isolates numerical
        # train/inference mismatch from the one-step staleness of the async loop (Slime's own metric
        # train_rollout_logprob_abs_diff includes both).
        # Slime's async loop trains batch k+1 after syncing step k, so keep the last few served versions.
        self.served: OrderedDict[str, torch.nn.Module] = OrderedDict(default=copy.deepcopy(model).eval())
        self.reference = copy.deepcopy(model).eval() if cfg.kl_coef > 0 else None  # frozen initial weights
        self._tb = self._tensorboard()
        if cfg.ckpt_dir:
            self.resume()

    def _tensorboard(self) -> Any:
        if not self.cfg.tensorboard_dir:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.info("tensorboard is not installed; metrics go to %s only", self.cfg.metrics_path or "the log")
            return None
        return SummaryWriter(self.cfg.tensorboard_dir)

    def train(self, samples: list[TrainingSample], rollout_metrics: dict[str, float] | None = None) -> StepResult:
        t0 = time.perf_counter()
        batch = build_batch(samples)
        reducer = make_sum_of_sample_mean(batch["response_lengths"], batch["loss_masks"])
        with torch.no_grad():  # old log-probs: recomputed with the weights that are about to be updated
            self.model.eval()
            old = packed_logits(self.model, batch["unconcat_tokens"])
            from slime_plugins.openclaw.logprobs import iter_response_logits, token_log_probs

            batch["log_probs"] = [token_log_probs(lg, tok) for lg, tok in iter_response_logits(self.args, batch, old)]
            if self.reference is not None:
                ref = packed_logits(self.reference, batch["unconcat_tokens"])
                batch["ref_log_probs"] = [token_log_probs(lg, tok) for lg, tok in iter_response_logits(self.args, batch, ref)]
        self.model.train()
        logits = packed_logits(self.model, batch["unconcat_tokens"])
        loss, loss_metrics = self.loss_fn(self.args, batch, logits, reducer)
        loss = loss / max(len(samples), 1)  # Slime scales by 1/global_batch_size: a mean over samples
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.step += 1
        # every loss metric is a sum of per-sample means (Slime's reducer): report the mean over samples
        metrics = {f"train/{k}": float(v) / max(len(samples), 1) for k, v in loss_metrics.items()}
        metrics.update(self._fidelity(samples))
        metrics.update({"train/grad_norm": float(grad_norm), "perf/train_seconds": time.perf_counter() - t0,
                        "rollout/samples": float(len(samples)), **(rollout_metrics or {})})
        if self.cfg.save_every and self.cfg.ckpt_dir and self.step % self.cfg.save_every == 0:
            self.save()
        return StepResult(self.step, metrics)

    def sync(self) -> float:
        """Push the current weights to the engine; returns milliseconds (logged with the step)."""
        t0 = time.perf_counter()
        version = f"step-{self.step}"
        self.sync_fn(self.model.state_dict(), version)
        elapsed = (time.perf_counter() - t0) * 1000
        oldest = self.served.popitem(last=False)[1] if len(self.served) >= 3 else copy.deepcopy(self.model)
        oldest.load_state_dict(self.model.state_dict())
        self.served[version] = oldest.eval()
        return elapsed

    @torch.no_grad()
    def _fidelity(self, samples: list[TrainingSample]) -> dict[str, float]:
        """Mean |trainer log-prob - rollout log-prob|, each sample scored with the weights that sampled it."""
        from slime_plugins.openclaw.logprobs import iter_response_logits, token_log_probs

        diffs: list[float] = []
        for version, model in self.served.items():
            same = [s for s in samples if s.metadata.get("weight_version") == version and s.response_length]
            if not same:
                continue
            batch = build_batch(same)
            logits = packed_logits(model, batch["unconcat_tokens"])
            diffs += [(token_log_probs(lg, tok) - rollout).abs().mean().item() for (lg, tok), rollout in
                      zip(iter_response_logits(self.args, batch, logits), batch["rollout_log_probs"])]
        if not diffs:
            return {"train/rollout_fidelity_samples": 0.0}
        return {"train/rollout_fidelity_abs_diff": sum(diffs) / max(len(diffs), 1),
                "train/rollout_fidelity_max_abs_diff": max(diffs, default=0.0),
                "train/rollout_fidelity_samples": float(len(diffs))}

    def log(self, metrics: dict[str, float]) -> None:
        self._log(metrics)

    def _log(self, metrics: dict[str, float]) -> None:
        if self.cfg.metrics_path:
            Path(self.cfg.metrics_path).parent.mkdir(parents=True, exist_ok=True)
            with open(self.cfg.metrics_path, "a") as f:
                f.write(json.dumps({"step": self.step, "time": time.time(), **metrics}) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, self.step)

    # --- checkpoints ------------------------------------------------------------------------------------

    def save(self) -> Path:
        from openclaw_rl.embedded.tiny_model import make_tokenizer_config_portable

        out = Path(self.cfg.ckpt_dir) / f"step-{self.step:06d}"
        tmp = out.with_name(out.name + ".tmp")
        self.model.save_pretrained(tmp)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(tmp)
            make_tokenizer_config_portable(tmp)
        torch.save({"optimizer": self.optimizer.state_dict(), "step": self.step}, tmp / "trainer_state.pt")
        tmp.rename(out)
        log.info("checkpoint saved: %s", out)
        return out

    def latest_checkpoint(self) -> Path | None:
        root = Path(self.cfg.ckpt_dir)
        done = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp")) if root.exists() else []
        return done[-1] if done else None

    def resume(self) -> bool:
        ckpt = self.latest_checkpoint()
        if ckpt is None:
            return False
        from safetensors.torch import load_file

        self.model.load_state_dict(load_file(ckpt / "model.safetensors"), strict=False)
        state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.sync_fn(self.model.state_dict(), f"step-{self.step}")
        log.info("resumed from %s (step %d)", ckpt, self.step)
        return True
