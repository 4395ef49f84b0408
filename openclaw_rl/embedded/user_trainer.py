"""One LoRA adapter per user on a frozen base: the embedded trainer, per person.

Stage: rollout → **trainer (per user)** → weight sync (adapters) → engine. Each batch from the proxy is
split by the samples' user (``metadata.user``, the API key's namespace or a trusted key's user,
``users/identity.py``); each user's samples train only that user's adapter, with the mode's own loss
(an ``EmbeddedTrainer`` per user over one shared PEFT model, so rl / opd / combine / oel are the same code
as the full-weight path), its own AdamW state, its own step count and weight version, and its own
checkpoints (``<ckpt_dir>/users/<adapter>/step-N``). One user's samples never reach another's adapter:
only the active adapter's parameters require gradients, and each optimizer holds only its user's.

A user is served the base model until their adapter has trained on ``min_samples`` samples; from then on
the sync after each of their steps loads the adapter into the engine (in process, or through
``/load_lora_adapter``) and records it in the proxy's ``AdapterDirectory``, which adds ``lora_path`` to
that user's requests.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from openclaw_rl.samples import TrainingSample
from openclaw_rl.users.adapters import AdapterDirectory, adapter_name
from openclaw_rl.users.identity import user_of

from .trainer import EmbeddedTrainer, StepResult, TrainerConfig, latest_checkpoint, log_step_metrics
from .write_failure import writing

log = logging.getLogger(__name__)

_PLACEHOLDER = "oc_zero"  # active when no user trains: B = 0, the plain forward is the base model's
_SCRATCH = "oc_scratch"  # holds an earlier published version of an adapter while its samples are scored
USER_FILE = "user.json"  # in each adapter checkpoint: whose it is (the name is a hash)

LoadAdapter = Callable[[str, dict[str, torch.Tensor], str], Any]
"""Puts one adapter (name, PEFT state dict, version) into the engine: ``TorchModel.load_adapter`` in process
(returns None: served under its name), ``SGLangAdapterSync.load`` (returns the versioned name it serves under)."""


def sample_user(sample: TrainingSample) -> str:
    return str(sample.metadata.get("user") or user_of(str(sample.metadata.get("session_key", ""))))


@dataclass
class _User:
    user: str
    name: str
    trainer: EmbeddedTrainer
    samples_trained: int = 0
    published: str | None = None  # the version the engine serves, None: the base serves this user
    served: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # the last few published
    # versions' weights, to score the fidelity of samples they sampled (the async loop's one-step lag)


class PerUserTrainer:
    """``EmbeddedTrainer``'s interface (train, sync, log, close, step) over one adapter per user."""

    def __init__(self, cfg: TrainerConfig, base_model: torch.nn.Module, lora: Any, *, load_adapter: LoadAdapter,
                 directory: AdapterDirectory | None = None, min_samples: int = 1, tokenizer: Any = None,
                 unload_adapter: Callable[[str], Any] | None = None):
        from peft import get_peft_model

        from .metric_sinks import MetricSinks

        if cfg.kl_coef > 0:
            raise ValueError("per-user adapters train without a KL term (the frozen base is the reference)")
        self.cfg, self.lora, self.load_adapter, self.directory = cfg, lora, load_adapter, directory
        self.min_samples, self.tokenizer = max(1, min_samples), tokenizer
        self.model = get_peft_model(base_model, copy.deepcopy(lora), adapter_name=_PLACEHOLDER)
        self.users: dict[str, _User] = {}
        self.dirty: set[str] = set()  # trained since their last sync
        self.step = 0  # batches trained (the run's step count; each user has its own)
        self.sinks = MetricSinks(cfg.tensorboard_dir, cfg.wandb)
        self.unload_adapter = unload_adapter  # takes an adapter out of the engine (deleting its user)
        self.lock = threading.RLock()  # a step, a sync, a save or a deletion at a time (deletions come from
        # the proxy's thread while the run's loop trains)
        self.deleted_samples: set[str] = set()  # ids of deleted users' samples a batch may still hold

    # --- users ------------------------------------------------------------------------------------

    def user_state(self, user: str) -> _User:
        found = self.users.get(user)
        if found is not None:
            return found
        name = adapter_name(user)
        self.model.add_adapter(name, copy.deepcopy(self.lora))
        self.model.set_adapter(name)  # only this adapter requires gradients: the optimizer takes exactly it
        ucfg = replace(self.cfg, fidelity_copies=0, metrics_path="", tensorboard_dir="", wandb=None, ckpt_dir="",
                       save_every=0)
        trainer = EmbeddedTrainer(ucfg, self.model, sync=lambda state, version, u=user: self._publish(u, version))
        found = self.users[user] = _User(user, name, trainer)
        if self.cfg.fidelity_copies > 0:  # until published, the user is served the base: this adapter at B = 0
            found.served["default"] = self.adapter_state(found)
        self._resume(found)
        return found

    def _publish(self, user: str, version: str) -> None:
        """The sync of one user's trainer: the engine gets the adapter once it has trained enough."""
        u = self.users[user]
        if u.samples_trained < self.min_samples:
            return
        state = self.adapter_state(u)
        name = self.load_adapter(u.name, state, version)
        u.published = version
        if self.cfg.fidelity_copies > 0:
            u.served[version] = state
            while len(u.served) > self.cfg.fidelity_copies:
                u.served.pop(next(iter(u.served)))
        if self.directory is not None:
            self.directory.loaded(user, version, name if isinstance(name, str) else None)

    def adapter_state(self, u: _User) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model, adapter_name=u.name).items()}

    def delete_user(self, user: str, sample_ids: Iterable[str] = ()) -> dict[str, int]:
        """Delete `user` (``DELETE /v1/users/{user}``): the adapter and optimizer here, the adapter in the engine
        and the proxy's directory, the adapter checkpoints on disk; `sample_ids` (theirs, in a batch already
        leased) are never trained. Waits for a step in progress to end. Returns what was removed."""
        with self.lock:
            self.deleted_samples.update(sample_ids)
            name = adapter_name(user)
            known = user in self.users
            served = known and self.users[user].published is not None
            self.forget(user)
            if _SCRATCH in self.model.peft_config:  # may hold an earlier version of theirs (fidelity scoring)
                self.model.delete_adapter(_SCRATCH)
                self.model.set_adapter(_PLACEHOLDER)
            if self.directory is not None:
                self.directory.unloaded(user)
            unloaded = 0
            if served and self.unload_adapter is not None:
                try:
                    self.unload_adapter(name)
                    unloaded = 1
                except KeyError:  # not loaded there (a restart of the engine)
                    pass
            checkpoints = 0
            if self.cfg.ckpt_dir:
                target = Path(self.cfg.ckpt_dir) / "users" / name
                if target.exists():
                    checkpoints = sum(1 for p in target.glob("step-*") if not p.name.endswith(".tmp"))
                    shutil.rmtree(target)
        log.warning("user %s deleted from the trainer: adapter %s (%s), %d checkpoints", user, name,
                    "trained" if known else "none here", checkpoints)
        return {"trainer_adapter": int(known), "engine_adapter": unloaded, "adapter_checkpoints": checkpoints}

    def forget(self, user: str) -> None:
        """Drop a user's adapter and optimizer here (the engine and the directory are the caller's)."""
        u = self.users.pop(user, None)
        self.dirty.discard(user)
        if u is not None:
            self.model.delete_adapter(u.name)
            self.model.set_adapter(_PLACEHOLDER)

    # --- the EmbeddedTrainer interface ------------------------------------------------------------

    def train(self, samples: list[TrainingSample], rollout_metrics: dict[str, float] | None = None) -> StepResult:
        with self.lock:
            if self.deleted_samples:
                kept = [s for s in samples if s.sample_id not in self.deleted_samples]
                if len(kept) < len(samples):
                    log.warning("%d samples of deleted users left out of this step", len(samples) - len(kept))
                samples = kept
            return self._train(samples, rollout_metrics)

    def _train(self, samples: list[TrainingSample], rollout_metrics: dict[str, float] | None = None) -> StepResult:
        t0 = time.perf_counter()
        by_user: dict[str, list[TrainingSample]] = {}
        for s in samples:
            by_user.setdefault(sample_user(s), []).append(s)
        sums: dict[str, float] = {}
        diffs: list[tuple[float, float]] = []  # (mean |Δlogprob|, samples) per user that measured it
        worst = 0.0
        entropy_max = 0.0  # the highest of the users' policy entropies: one adapter collapsing into babble shows
        # here while the batch mean hides it (a 5e-3 run's collapse did, docs/users.md)
        for user, group in sorted(by_user.items()):
            u = self.user_state(user)
            self.model.set_adapter(u.name)
            trained_from = u.trainer.serving
            result = u.trainer.train(group)
            u.samples_trained += len(group)
            result.metrics.update(self._earlier_fidelity(u, group, trained_from))
            self.dirty.add(user)
            for k, v in result.metrics.items():
                if k.startswith("train/") and "fidelity" not in k:
                    sums[k] = sums.get(k, 0.0) + v * len(group)
            if result.metrics.get("train/rollout_fidelity_samples"):
                diffs.append((result.metrics["train/rollout_fidelity_abs_diff"],
                              result.metrics["train/rollout_fidelity_samples"]))
            if "fidelity/earlier_count" in result.metrics:
                count = result.metrics["fidelity/earlier_count"]
                diffs.append((result.metrics["fidelity/earlier_sum"] / count, count))
                worst = max(worst, result.metrics["fidelity/earlier_max"])
            worst = max(worst, result.metrics.get("train/rollout_fidelity_max_abs_diff", 0.0))
            entropy_max = max(entropy_max, result.metrics.get("train/entropy_loss", 0.0))
        self.model.set_adapter(_PLACEHOLDER)
        self.step += 1
        n = max(len(samples), 1)
        metrics = {k: v / n for k, v in sums.items()}
        if diffs:
            count = sum(c for _, c in diffs)
            metrics["train/rollout_fidelity_abs_diff"] = sum(d * c for d, c in diffs) / max(count, 1)
            metrics["train/rollout_fidelity_samples"] = count
            metrics["train/rollout_fidelity_max_abs_diff"] = worst
        sizes = [len(group) for group in by_user.values()] or [0]
        metrics.update({"users/trained": float(len(by_user)), "users/known": float(len(self.users)),
                        "users/samples_min": float(min(sizes)), "users/samples_max": float(max(sizes)),
                        "users/entropy_max": entropy_max,
                        "users/served_adapters": float(sum(u.published is not None for u in self.users.values())),
                        "perf/train_seconds": time.perf_counter() - t0, "rollout/samples": float(len(samples)),
                        **(rollout_metrics or {})})
        if self.cfg.save_every and self.cfg.ckpt_dir and self.step % self.cfg.save_every == 0:
            self.save()
        return StepResult(self.step, metrics)

    @torch.no_grad()
    def _earlier_fidelity(self, u: _User, group: list[TrainingSample], trained_from: str | None) -> dict[str, float]:
        """|trainer - rollout| log-prob of the samples an earlier published version of `u`'s adapter sampled,
        scored with exactly that version (the training forward scored those of ``trained_from``)."""
        from .trainer import build_batch, sequence_logprobs

        done: list[float] = []  # per sample: mean |Δ| over its response tokens
        for version, state in u.served.items():
            same = [s for s in group if s.metadata.get("weight_version") == version and s.response_length
                    and version != trained_from]
            if not same:
                continue
            from peft import set_peft_model_state_dict

            if _SCRATCH not in self.model.peft_config:
                self.model.add_adapter(_SCRATCH, copy.deepcopy(self.lora))
            set_peft_model_state_dict(self.model, state, adapter_name=_SCRATCH)
            self.model.set_adapter(_SCRATCH)
            self.model.eval()
            batch = build_batch(same)
            lps = sequence_logprobs(self.model, batch, u.trainer.args)
            done += [(lp - r).abs().mean().item() for lp, r in zip(lps, batch["rollout_log_probs"])]
        self.model.set_adapter(u.name)
        self.model.train()
        if not done:
            return {}
        return {"fidelity/earlier_sum": sum(done), "fidelity/earlier_count": float(len(done)),
                "fidelity/earlier_max": max(done)}

    def sync(self) -> float:
        """Load every adapter trained since the last sync into the engine; returns milliseconds."""
        t0 = time.perf_counter()
        with self.lock:
            for user in sorted(self.dirty):
                self.users[user].trainer.sync()
            self.dirty.clear()
        return (time.perf_counter() - t0) * 1000

    def log(self, metrics: dict[str, float]) -> None:
        log_step_metrics(self.cfg.metrics_path, self.step, metrics, self.sinks)

    def close(self) -> None:
        self.sinks.close()

    # --- checkpoints: one directory per adapter ------------------------------------------------------

    def user_dir(self, u: _User) -> Path:
        return Path(self.cfg.ckpt_dir) / "users" / u.name

    def save(self) -> list[Path]:
        with self.lock:
            return self._save()

    def _save(self) -> list[Path]:
        from safetensors.torch import save_file

        saved = []
        for u in list(self.users.values()):
            out = self.user_dir(u) / f"step-{u.trainer.step:06d}"
            if out.exists():
                continue
            tmp = out.with_name(out.name + ".tmp")
            with writing("an adapter checkpoint", out, partial=tmp):
                tmp.mkdir(parents=True, exist_ok=True)
                save_file(self.adapter_state(u), str(tmp / "adapter_model.safetensors"))
                self.lora.save_pretrained(str(tmp))  # adapter_config.json: what SGLang's lora_path reads
                torch.save({"optimizer": u.trainer.optimizer.state_dict(), "step": u.trainer.step,
                            "samples_trained": u.samples_trained}, tmp / "trainer_state.pt")
                (tmp / USER_FILE).write_text(json.dumps({"user": u.user}) + "\n")
            tmp.rename(out)
            saved.append(out)
        return saved

    def _resume(self, u: _User) -> None:
        if not self.cfg.ckpt_dir:
            return
        ckpt = latest_checkpoint(self.user_dir(u))
        if ckpt is None:
            return
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(self.model, load_file(ckpt / "adapter_model.safetensors"), adapter_name=u.name)
        state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
        u.trainer.optimizer.load_state_dict(state["optimizer"])
        u.trainer.step, u.samples_trained = int(state["step"]), int(state.get("samples_trained", 0))
        u.trainer.sync()  # the engine serves what was saved (if it had trained enough)
        log.info("resumed the adapter of %s from %s (its step %d)", u.user, ckpt, u.trainer.step)
