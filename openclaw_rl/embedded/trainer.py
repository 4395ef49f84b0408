"""The embedded single-process trainer: Slime's loop semantics on one CPU, with the same loss code.

Stage: rollout → **trainer** → weight sync → engine. Per step: take a batch from the proxy runtime
(while the *next* batch is already being collected, Slime's ``train_async`` shape), build the batch
dict Slime's Megatron actor would build (GRPO reward broadcast, teacher fields, recomputed old
log-probs), call the mode's loss function from ``openclaw_rl.losses`` / ``openclaw_*`` — the very functions
the Slime path uses — step AdamW, push the new weights into the engine in-process, acknowledge the
batch so it leaves the spool, and log. Deliberately absent: data/tensor parallelism.

Long samples (an OpenClaw prompt is ~12-25K tokens) are trained in memory linear in their length:
each sample is its own unpadded forward (causal SDPA, no [T, T] mask; no right-padding to the longest
sample) and the output head runs only on the rows that predict response tokens (``response_logits``),
so no [T, vocab] logits exist; for a Qwen3 model the last decoder layer, too, runs only on those rows
(``tail_forward``). Samples are micro-batches of one with gradient accumulation; Slime's
losses are sums of per-sample means, so the gradient is exactly the whole batch's.

One forward per sample, not three: with one optimizer step per batch the "old" log-probs (Slime's
recompute with the weights about to be updated) are the training forward's own log-probs, detached, and
a sample sampled by exactly those weights gets its fidelity score from them too. Only a model with active
dropout, whose training forward is not the policy's, pays for a separate no-grad pass.
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

from openclaw_rl.losses.policy_math import grpo_advantages, make_sum_of_sample_mean
from openclaw_rl.samples import TrainingSample

from .metric_sinks import MetricSinks, WandbConfig
from .write_failure import writing

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
    center_rewards: bool = False  # A = r - batch mean (see build_batch); off: rl mode's A = r, as upstream
    rollout_temperature: float = 1.0  # must equal the proxy's, so trainer and rollout log-probs agree
    distill_topk: int = 0  # opd: K > 0 trains the top-K reverse-KL loss instead of token-level OPD
    distill_subset: str = "teacher"  # which ids the top-K loss compares (openclaw_opd.loss.distill_subset)
    w_rl: float = 1.0
    w_opd: float = 1.0
    combine_loss: str = "ppo"  # combine: ppo, or topk_select (openclaw_combine/topk_select.py)
    topk_adv_diff_clip: float = 1.0  # combine topk_select: |teacher - old| clip per id
    save_every: int = 0  # checkpoint every N steps (0 = never)
    ckpt_dir: str = ""
    metrics_path: str = ""  # JSONL, one line per step
    tensorboard_dir: str = ""  # TensorBoard event files here when tensorboard is installed (metric_sinks.py)
    wandb: WandbConfig | None = None  # W&B when asked for (--wandb) and importable
    seed: int = 0
    max_staleness: int = -1  # refuse samples sampled more than N steps ago (-1: no bound); see staleness.py
    fidelity_copies: int = 3  # served weight versions kept to score fidelity; 0 saves their memory (large models)
    # opd/combine: "trainer" holds a frozen teacher that scores samples carrying teacher_prompt_ids (frozen_teacher.py)
    teacher_source: str = "server"
    teacher_checkpoint: str = ""  # trainer source: the teacher's checkpoint (empty: the initial policy weights)

    def slime_args(self) -> SimpleNamespace:
        """The attributes Slime's ``args`` carries that the loss functions read."""
        return SimpleNamespace(eps_clip=self.eps_clip, eps_clip_high=self.eps_clip_high, eps_clip_c=None,
                               entropy_coef=self.entropy_coef, use_kl_loss=self.kl_coef > 0,
                               kl_loss_coef=self.kl_coef,
                               kl_loss_type="low_var_kl", rollout_temperature=self.rollout_temperature,
                               use_rollout_logprobs=False, distill_topk=self.distill_topk,
                               openclaw_opd_distill_subset=self.distill_subset,
                               openclaw_combine_w_rl=self.w_rl, openclaw_combine_w_opd=self.w_opd,
                               openclaw_combine_loss=self.combine_loss,
                               openclaw_combine_topk_adv_diff_clip=self.topk_adv_diff_clip,
                               advantage_estimator="grpo", qkv_format="thd")


def loss_for(cfg: TrainerConfig) -> Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """The loss each mode trains with, exactly as its Slime launch script configures it (``MODES``)."""
    from openclaw_rl.modes import get_mode, resolve

    return resolve(get_mode(cfg.mode).embedded_loss)


# --- batch ----------------------------------------------------------------------------------------------


def build_batch(samples: list[TrainingSample], center_rewards: bool = False) -> dict[str, Any]:
    """The per-sample tensors Slime's actor hands a loss (``_get_rollout_data`` + advantages).

    `center_rewards`: GRPO's reward normalisation with the batch as one group (A = r - mean r) instead of
    --disable-rewards-normalization's A = r; ``rewards`` stay the raw ones either way.
    """
    rewards = torch.tensor([s.reward for s in samples])
    groups = [0] * len(samples) if center_rewards else None
    tokens = [torch.tensor(s.tokens, dtype=torch.long) for s in samples]
    response_lengths = [s.response_length for s in samples]
    batch: dict[str, Any] = {
        "unconcat_tokens": tokens,
        "total_lengths": [len(t) for t in tokens],
        "response_lengths": response_lengths,
        "loss_masks": [torch.tensor(s.loss_mask, dtype=torch.int32) for s in samples],
        "rollout_log_probs": [torch.tensor(s.rollout_log_probs, dtype=torch.float32) for s in samples],
        # --advantage-estimator grpo (--disable-rewards-normalization unless centred): A_t = r on every token
        "advantages": grpo_advantages(rewards, response_lengths, groups, normalize=center_rewards),
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


def response_logits(model: torch.nn.Module, tokens: torch.Tensor, response_length: int,
                    tail: bool = False) -> torch.Tensor:
    """[R + 1, V] fp32 logits of the last R + 1 positions of one sample, from one unpadded forward.

    Row j predicts ``tokens[T - R + j]`` (the last row predicts past the end and is never read). No
    attention mask is passed, so attention is plain causal SDPA, linear in memory on CPU; the head
    runs on R + 1 rows only (``logits_to_keep``), so a 25K-token prompt costs no [25K, V] logits.
    `tail` (a model that passed ``tail_forward_usable``): the last layer runs on those rows only too.
    """
    from .tail_forward import response_rows_logits

    return response_rows_logits(model, tokens, response_length + 1, tail).float()


def response_view(batch: dict[str, Any], indices: list[int] | None = None) -> dict[str, Any]:
    """The batch (or the samples at `indices`) laid out for `response_logits`: each sample keeps its
    last R + 1 tokens, so Slime's slicing (``iter_response_logits``) reads exactly the computed rows."""
    n = len(batch["unconcat_tokens"])
    picked = list(range(n)) if indices is None else indices
    view = {k: [v[i] for i in picked] if isinstance(v, list) and len(v) == n else v for k, v in batch.items()}
    view["unconcat_tokens"] = [t[len(t) - r - 1:] for t, r in zip(view["unconcat_tokens"], view["response_lengths"])]
    view["total_lengths"] = [r + 1 for r in view["response_lengths"]]
    return view


@torch.no_grad()
def view_logprobs(args: Any, view: dict[str, Any], logits: torch.Tensor) -> list[torch.Tensor]:
    """Detached log-probs of the response tokens of `view`'s samples from their `response_logits` [1, ·, V]."""
    from openclaw_rl.losses.logprobs import iter_response_logits, token_log_probs

    return [token_log_probs(lg, tok) for lg, tok in iter_response_logits(args, view, logits.detach())]


@torch.no_grad()
def sequence_logprobs(model: torch.nn.Module, batch: dict[str, Any], args: Any,
                      tail: bool = False) -> list[torch.Tensor]:
    """Per sample, the log-probs of its response tokens under `model` (temperature as in `args`)."""
    out = []
    for i, (tokens, r) in enumerate(zip(batch["unconcat_tokens"], batch["response_lengths"])):
        out += view_logprobs(args, response_view(batch, [i]), response_logits(model, tokens, r, tail).unsqueeze(0))
    return out


def has_active_dropout(model: torch.nn.Module) -> bool:
    """Whether `model` in train mode computes something else than in eval mode (dropout > 0 anywhere:
    a dropout module, or an attention module's own ``attention_dropout`` as transformers' models keep it)."""
    return any((isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0)
               or float(getattr(m, "attention_dropout", 0.0) or 0.0) > 0 for m in model.modules())


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def batch_to(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Every tensor of a batch (also inside lists) on ``device``; a no-op on CPU."""
    if device.type == "cpu":
        return batch
    def move(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.to(device)
        return [move(x) for x in v] if isinstance(v, list) else v
    return {k: move(v) for k, v in batch.items()}


# --- the trainer ----------------------------------------------------------------------------------------


def metric_text(metrics: dict[str, float], key: str, spec: str = ".1e") -> str:
    """A step line's value, or ``n/a`` when the step did not measure it (``|Δlogprob|`` for samples no kept
    copy of the weights sampled, e.g. right after a resume), rather than ``nan``."""
    value = metrics.get(key)
    return "n/a" if value is None or value != value else format(value, spec)


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    """The newest finished checkpoint under ``ckpt_dir`` (``step-NNNNNN``; a ``.tmp`` save was cut short)."""
    root = Path(ckpt_dir)
    done = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp")) if root.exists() else []
    return done[-1] if done else None


def run_has_checkpoint(ckpt_dir: str | Path) -> bool:
    """A finished checkpoint a restarted run resumes: the full-weight trainer's, or any per-user adapter's
    (``users/<adapter>/step-N``, ``user_trainer.py``)."""
    root = Path(ckpt_dir)
    users = root / "users"
    return latest_checkpoint(root) is not None or (
        users.is_dir() and any(latest_checkpoint(d) is not None for d in users.iterdir() if d.is_dir()))


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
        self.served: OrderedDict[str, torch.nn.Module] = OrderedDict()
        if cfg.fidelity_copies > 0:
            self.served["default"] = copy.deepcopy(model).eval()
        # The version label of the weights `model` holds right now, while no step has changed them since
        # they were served (None after a step until the next sync): samples with this label are scored
        # for fidelity from the training forward itself.
        self.serving: str | None = "default"
        self.separate_old_pass = has_active_dropout(model)
        from .tail_forward import tail_forward_usable

        self.tail = not self.separate_old_pass and tail_forward_usable(model)  # last layer on the kept rows only
        self.reference = copy.deepcopy(model).eval() if cfg.kl_coef > 0 else None  # frozen initial weights
        self.teacher = None  # the in-trainer teacher (teacher_source trainer), built before a resume loads weights
        if cfg.teacher_source == "trainer":
            from .frozen_teacher import FrozenTeacher

            self.teacher = FrozenTeacher.build(model, cfg.teacher_checkpoint, tokenizer, initial_copy=self.reference)
        self.sinks = MetricSinks(cfg.tensorboard_dir, cfg.wandb)
        if cfg.ckpt_dir:
            self.resume()

    def train(self, samples: list[TrainingSample], rollout_metrics: dict[str, float] | None = None) -> StepResult:
        t0 = time.perf_counter()
        from .staleness import admit

        samples, stale_metrics = admit(samples, self.step, self.cfg.max_staleness)
        if not samples:  # the whole batch was too stale: no step, the caller still acknowledges it
            return StepResult(self.step, {**stale_metrics, **(rollout_metrics or {})})
        batch = batch_to(build_batch(samples, self.cfg.center_rewards), model_device(self.model))
        from .frozen_teacher import fill_teacher_fields

        teacher_metrics = fill_teacher_fields(batch, samples, self.teacher, self.args, self.cfg.distill_topk,
                                              self.model if self.cfg.distill_subset == "student" else None, self.tail)
        if self.separate_old_pass:  # dropout: the old log-probs are the eval-mode policy's, a pass of their own
            self.model.eval()
            batch["log_probs"] = sequence_logprobs(self.model, batch, self.args, self.tail)
        if self.reference is not None:
            batch["ref_log_probs"] = sequence_logprobs(self.reference, batch, self.args, self.tail)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_metrics: dict[str, float] = {}
        old_log_probs: list[torch.Tensor] = []
        for i in range(len(samples)):  # one sample per forward/backward: memory of one sample at a time
            view = response_view(batch, [i])
            reducer = make_sum_of_sample_mean(view["response_lengths"], view["loss_masks"])
            logits = response_logits(self.model, batch["unconcat_tokens"][i], batch["response_lengths"][i], self.tail)
            logits = logits.unsqueeze(0)
            if not self.separate_old_pass:
                # old log-probs: those of the weights about to be updated, i.e. this forward's, detached
                view["log_probs"] = view_logprobs(self.args, view, logits)
            old_log_probs += view["log_probs"]
            loss, metrics_i = self.loss_fn(self.args, view, logits, reducer)
            # Slime scales by 1/global_batch_size: a mean over samples
            (loss / max(len(samples), 1)).backward()
            for k, v in metrics_i.items():  # every metric is a per-sample mean: the batch's is their sum
                loss_metrics[k] = loss_metrics.get(k, 0.0) + float(v)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        trained_version, self.serving = self.serving, None
        self.step += 1
        # every loss metric is a sum of per-sample means (Slime's reducer): report the mean over samples
        metrics = {f"train/{k}": v / max(len(samples), 1) for k, v in loss_metrics.items()}
        metrics.update(self._fidelity(samples, trained_version, old_log_probs))
        metrics.update(stale_metrics)
        metrics.update(teacher_metrics)
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
        self.serving = version
        elapsed = (time.perf_counter() - t0) * 1000
        if self.cfg.fidelity_copies <= 0:
            return elapsed
        oldest = (self.served.popitem(last=False)[1] if len(self.served) >= self.cfg.fidelity_copies
                  else copy.deepcopy(self.model))
        oldest.load_state_dict(self.model.state_dict())
        self.served[version] = oldest.eval()
        return elapsed

    @torch.no_grad()
    def _fidelity(self, samples: list[TrainingSample], trained_version: str | None,
                  old_log_probs: list[torch.Tensor]) -> dict[str, float]:
        """Mean |trainer log-prob - rollout log-prob|, each sample scored with the weights that sampled it.

        `trained_version` labels the weights this step started from (None: unknown); samples sampled by
        them are scored with `old_log_probs`, already computed from exactly those weights.
        """
        diffs: list[float] = []
        if trained_version is not None and not self.separate_old_pass:
            for s, lp in zip(samples, old_log_probs):
                if s.metadata.get("weight_version") == trained_version and s.response_length:
                    rollout = torch.tensor(s.rollout_log_probs, dtype=torch.float32, device=lp.device)
                    diffs.append((lp - rollout).abs().mean().item())
        for version, model in self.served.items():
            same = [s for s in samples if s.metadata.get("weight_version") == version and s.response_length
                    and (version != trained_version or self.separate_old_pass)]
            if not same:
                continue
            batch = batch_to(build_batch(same), model_device(model))
            diffs += [(lp - rollout).abs().mean().item() for lp, rollout in
                      zip(sequence_logprobs(model, batch, self.args, self.tail), batch["rollout_log_probs"])]
        if not diffs:
            return {"train/rollout_fidelity_samples": 0.0}
        return {"train/rollout_fidelity_abs_diff": sum(diffs) / max(len(diffs), 1),
                "train/rollout_fidelity_max_abs_diff": max(diffs, default=0.0),
                "train/rollout_fidelity_samples": float(len(diffs))}

    def log(self, metrics: dict[str, float]) -> None:
        self._log(metrics)

    def _log(self, metrics: dict[str, float]) -> None:
        log_step_metrics(self.cfg.metrics_path, self.step, metrics, self.sinks)

    def close(self) -> None:
        """Flush and close TensorBoard and W&B (the metrics file is appended per step)."""
        self.sinks.close()

    # --- checkpoints ------------------------------------------------------------------------------------

    def save(self) -> Path:
        from openclaw_rl.embedded.tiny_model import make_tokenizer_config_portable

        out = Path(self.cfg.ckpt_dir) / f"step-{self.step:06d}"
        tmp = out.with_name(out.name + ".tmp")
        with writing("a checkpoint", out, partial=tmp):
            self.model.save_pretrained(tmp)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(tmp)
                make_tokenizer_config_portable(tmp)
            torch.save({"optimizer": self.optimizer.state_dict(), "step": self.step}, tmp / "trainer_state.pt")
        tmp.rename(out)
        log.info("checkpoint saved: %s", out)
        return out

    def latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.cfg.ckpt_dir)

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
        self.serving = f"step-{self.step}"
        log.info("resumed from %s (step %d)", ckpt, self.step)
        return True


def log_step_metrics(metrics_path: str, step: int, metrics: dict[str, float], sinks: Any) -> None:
    """One step's metrics: a line of ``metrics_path`` (JSON, appended) and the TensorBoard/W&B sinks."""
    if metrics_path:
        with writing("the step's metrics", metrics_path):
            Path(metrics_path).parent.mkdir(parents=True, exist_ok=True)
            with open(metrics_path, "a") as f:
                f.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
    sinks.write(metrics, step)
