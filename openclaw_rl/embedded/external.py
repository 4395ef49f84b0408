"""``openclaw-rl train``: the proxy and the embedded trainer in front of an external SGLang server.

``serve`` only collects samples; ``local`` owns its engines (the tiny model, in-process). ``train`` is
the one-GPU (or one-CPU) path without Slime: the policy is served by a real SGLang (or ``openclaw-rl
engine``) that you launched from ``--model``, the judge by any SGLang-compatible server, and this process
runs the proxy plus the trainer on the same checkpoint. The loop is Slime's ``train_async`` with an update
interval of 1, as in ``local``: batch k+1 is collected while step k trains; once it is full, submission is
paused (the proxy's gate) and the new weights go to the server through SGLang's own
``/update_weights_from_disk`` under the label ``step-N``. The proxy records the label the server reports
for every turn, and the trainer refuses samples older than ``--max-staleness`` steps. A policy server
that restarts (back on its launch weights, ``default``) is given the last synced weights again before it
serves (``version_guard.py``, every ``--version-check-s``).
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .hf_policy import PolicyLoadConfig
from .interrupts import name_of, sigterm_as_ctrl_c, while_starting
from .metric_sinks import add_wandb_flag, wandb_config
from .write_failure import WriteFailed

if TYPE_CHECKING:
    from openclaw_rl.runtime import ProxyRuntime

    from .version_guard import VersionGuard

log = logging.getLogger(__name__)


@dataclass
class ExternalConfig:
    model: str  # the checkpoint the policy server was launched from; the trainer starts from it too
    settings: Any  # openclaw_rl.config.Settings: proxy, judge, spool (policy_url is the server to sync)
    policy: PolicyLoadConfig = field(default_factory=PolicyLoadConfig)
    out_dir: str = "runs/train"
    sync_dir: str = ""  # default <out_dir>/weights; must be readable by the policy server (same machine)
    rollout_batch_size: int = 16
    lr: float = 1e-6
    kl_coef: float = 0.0
    max_staleness: int = 2  # the async loop trains 1 step off-policy; turns finished after a batch closed, 2
    fidelity_copies: int = 3  # 0: no weight copies for the fidelity metric (large models on one GPU)
    max_steps: int = 0  # 0 = until interrupted
    save_every: int = 0
    seed: int = 0
    simulate_interactions: int = 0  # > 0: drive the proxy with this many simulated-user calls (demo, tests)
    simulate_concurrency: int = 4
    max_new_tokens: int = 64  # for the simulated users' requests only
    version_check_s: float = 1.0  # how often the policy server's weight version is checked; a restarted
    # server (back on its launch weights) gets the last synced ones again before it serves. 0 = never
    wandb_project: str = ""  # --wandb: also log the step metrics to this W&B project
    per_user_adapters: bool = False  # one LoRA per user, loaded into SGLang by /load_lora_adapter (users/)
    adapter_rank: int = 8
    adapter_min_samples: int = 1


@dataclass
class TrainReport:
    steps: int = 0
    versions: list[str] = field(default_factory=list)  # what the server reported after each sync
    fidelity: list[float] = field(default_factory=list)  # train/rollout_fidelity_abs_diff per step
    stale_refused: int = 0
    restores: int = 0  # times a restarted policy server was given the last synced weights again
    sync_ms: list[float] = field(default_factory=list)
    interactions: int = 0
    metrics_path: str = ""
    seconds: float = 0.0


def check_policy_server(info: dict[str, Any], model: str) -> list[str]:
    """What in ``/server_info`` would silently spoil training; raises on what makes it wrong.

    The proxy reads both of SGLang's streaming modes exactly (``openclaw_rl.backend.StreamAssembler``),
    but the default cumulative chunks repeat every id so far, so a long streamed reply costs CPU that grows
    faster than its length: ``--incremental-streaming-output`` is recommended. SGLang's ``--dtype auto``
    serves a float32 checkpoint in float16, which moves rollout log-probs ~5e-3 away from an fp32 trainer
    (``--dtype float32``: ~1e-5).
    """
    warnings = []
    if info.get("incremental_streaming_output") is False:
        warnings.append("the policy server streams cumulatively (SGLang's default): correct, but long streamed "
                        "replies cost the proxy more CPU; launch it with --incremental-streaming-output")
    if info.get("dtype") == "auto" and _checkpoint_dtype(model) in ("float32", None):
        warnings.append("the policy server runs --dtype auto, which serves a float32 checkpoint in float16: "
                        "launch it with --dtype float32 (CPU) or bfloat16 (GPU, bf16 checkpoint)")
    return warnings


def _checkpoint_dtype(model: str) -> str | None:
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config.get("dtype") or config.get("torch_dtype")


class ExternalStack:
    """The proxy (its own thread), the trainer and the weight-sync client; ``close()`` stops the proxy."""

    def __init__(self, cfg: ExternalConfig):
        from transformers import AutoTokenizer

        from .engine_sync import weight_sync_for

        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        settings = cfg.settings
        if not settings.proxy.tokenizer:
            settings.proxy.tokenizer = cfg.model
        if not settings.spool.dir:
            settings.spool.dir = str(self.out / "spool")
        self.tokenizer = AutoTokenizer.from_pretrained(settings.proxy.tokenizer)
        # every policy engine (several URLs, or a router's workers) gets each step's weights
        self.weights = weight_sync_for(settings.proxy.policy_url, cfg.sync_dir or self.out / "weights",
                                       api_key=settings.proxy.policy_api_key)
        self.runtime: ProxyRuntime | None = None
        self.guard: VersionGuard | None = None
        self.stop_event = threading.Event()
        try:
            self._start(cfg)
        except BaseException:  # a failed start, or Ctrl-C while the checkpoint loads: stop what did start
            self.close()
            raise

    def _start(self, cfg: ExternalConfig) -> None:
        from openclaw_rl.runtime import ProxyRuntime

        from .frozen_teacher import trainer_teacher_source, trainer_topk
        from .hf_policy import load_policy
        from .trainer import EmbeddedTrainer, TrainerConfig
        from .version_guard import VersionGuard

        settings = cfg.settings
        served = self.weights.server_version()  # fails early and clearly if the server is not there
        for warning in check_policy_server(dict(self.weights.info("server_info")), cfg.model):
            log.warning(warning)
        model = load_policy(cfg.model, cfg.policy)
        self.metrics_path = str(self.out / "metrics.jsonl")
        temperature = settings.proxy.rollout_temperature
        tcfg = TrainerConfig(mode=settings.mode, rollout_batch_size=cfg.rollout_batch_size, lr=cfg.lr,
                             kl_coef=cfg.kl_coef, distill_topk=trainer_topk(settings, settings.opd.distill_topk),
                             distill_subset=settings.opd.distill_subset,
                             w_rl=settings.combine.w_rl, w_opd=settings.combine.w_opd,
                             combine_loss=settings.combine.loss, topk_adv_diff_clip=settings.combine.topk_adv_diff_clip,
                             teacher_source=trainer_teacher_source(settings),
                             teacher_checkpoint=settings.opd.teacher_checkpoint,
                             rollout_temperature=1.0 if temperature is None else temperature,
                             save_every=cfg.save_every, ckpt_dir=str(self.out / "checkpoints") if cfg.save_every else "",
                             metrics_path=self.metrics_path, tensorboard_dir=str(self.out / "tensorboard"),
                             seed=cfg.seed, max_staleness=cfg.max_staleness, fidelity_copies=cfg.fidelity_copies,
                             wandb=wandb_config(cfg.wandb_project, "train", str(self.out)))
        # The trainer hands its sync function a state dict; the server needs merged full weights, which
        # the sync client derives from the model itself (LoRA included).
        if cfg.per_user_adapters:
            from openclaw_rl.users.train_wiring import per_user_trainer

            self.trainer = per_user_trainer(self, cfg, tcfg, model)
        else:
            self.trainer = EmbeddedTrainer(tcfg, model, sync=lambda _state, version: self.weights.sync(model, version),
                                           tokenizer=self.tokenizer)
        if self.trainer.step == 0 and served != "default":
            log.warning("the policy server already serves %r, not the checkpoint's initial weights: samples it "
                        "produced count as unversioned until the first sync", served)
        self.runtime = ProxyRuntime(settings, tokenizer=self.tokenizer)
        if cfg.per_user_adapters:  # the proxy's per-request choice follows the adapters the trainer publishes
            self.trainer.directory = self.runtime.proxy.service.adapters
            from .local_users import admit_user_deletion

            admit_user_deletion(self.runtime.proxy, self.trainer)
        self.guard = VersionGuard(getattr(self.weights, "engines", [self.weights]), self.runtime.proxy.gate,
                                  interval_s=cfg.version_check_s)
        self.guard.start()
        self.runtime.proxy.dashboard.metrics_path = Path(self.metrics_path)  # /dashboard's training curves

    @property
    def url(self) -> str:
        return self.runtime.url

    def close(self) -> None:
        self.stop_event.set()
        if self.guard is not None:
            self.guard.stop()
        if self.runtime is not None:
            self.runtime.stop()
        if getattr(self, "trainer", None) is not None:
            self.trainer.close()
        self.weights.close()


def run_train(cfg: ExternalConfig, *, echo: bool = True) -> TrainReport:
    started = time.monotonic()
    with while_starting():
        stack = ExternalStack(cfg)
    report = TrainReport(metrics_path=stack.metrics_path)
    if echo:
        print(f"openclaw-rl train ({cfg.settings.mode}): proxy at {stack.url}/v1 -> policy "
              f"{cfg.settings.proxy.policy_url}, judge {cfg.settings.judge.url or '(none: PRM off)'}; "
              f"weights sync through {stack.weights.dir}", flush=True)
    sim: dict[str, Any] = {}
    sim_thread = None
    if cfg.simulate_interactions > 0:
        sim_thread = threading.Thread(target=_simulate, args=(stack, cfg, sim), daemon=True)
        sim_thread.start()
    pool = ThreadPoolExecutor(1, thread_name_prefix="collect")
    failed: WriteFailed | None = None
    try:
        pending: Future = pool.submit(stack.runtime.collect, cfg.rollout_batch_size, stop=stack.stop_event)
        current = pending.result()
        while current is not None and not stack.stop_event.is_set():
            pending = pool.submit(stack.runtime.collect, cfg.rollout_batch_size, stop=stack.stop_event)
            before = stack.trainer.step
            result = stack.trainer.train(current.samples, current.metrics)
            nxt = pending.result()  # the gate is closed again once the next batch is full: sync now
            if result.step != before:
                result.metrics["perf/sync_ms"] = stack.trainer.sync()
                result.metrics.update(stack.weights.last_timings)
                report.sync_ms.append(result.metrics["perf/sync_ms"])
                report.versions.append(stack.weights.server_version())
            stack.runtime.ack(current.batch_id, result.step)
            stack.trainer.log(result.metrics)
            report.steps = result.step
            report.stale_refused += int(result.metrics.get("train/stale_samples_refused", 0)
                                        + result.metrics.get("train/foreign_samples_refused", 0))
            if "train/rollout_fidelity_abs_diff" in result.metrics:
                report.fidelity.append(result.metrics["train/rollout_fidelity_abs_diff"])
            if echo:
                _print_step(result.step, result.metrics)
            current = nxt
            if cfg.max_steps and result.step >= cfg.max_steps:
                break
    except KeyboardInterrupt as exc:
        print(f"\ninterrupted ({name_of(exc)}): untrained samples stay in the spool for the next run", flush=True)
    except WriteFailed as exc:  # a full disk: stop as on SIGTERM, then `openclaw-rl` prints the one line
        failed = exc
    finally:
        stack.stop_event.set()
        stack.guard.stop()
        stack.runtime.proxy.gate.open()  # no more syncs: requests held at the gate may finish
        loop, task = sim.get("loop"), sim.get("task")
        if loop is not None and task is not None and not task.done():
            loop.call_soon_threadsafe(task.cancel)
        if sim_thread is not None:
            sim_thread.join(60)
        pool.shutdown(wait=True, cancel_futures=True)
        stack.close()
    result_sim = sim.get("result") or sim.get("live")
    report.interactions = len(result_sim.interactions) if result_sim is not None else 0
    report.restores = stack.weights.restores
    report.seconds = time.monotonic() - started
    try:
        (stack.out / "report.json").write_text(json.dumps(asdict(report), indent=2))
    except OSError as exc:
        log.warning("report.json not written: %s", exc)
    if failed is not None:
        raise failed
    return report


def _simulate(stack: ExternalStack, cfg: ExternalConfig, out: dict[str, Any]) -> None:
    from .simulate import drive_simulation

    drive_simulation(stack.url, stack.stop_event, out, interactions=cfg.simulate_interactions,
                     concurrency=cfg.simulate_concurrency, seed=cfg.seed,
                     model=cfg.settings.proxy.served_model_name, max_tokens=cfg.max_new_tokens)


def _print_step(step: int, m: dict[str, float]) -> None:
    from .trainer import metric_text  # loaded by then: the step was trained

    print(f"step {step:4d} | reward {m.get('rollout/reward_mean', 0):+.2f} | loss {m.get('train/loss', 0):+.4f} | "
          f"|Δlogprob| {metric_text(m, 'train/rollout_fidelity_abs_diff')} | staleness max "
          f"{metric_text(m, 'train/staleness_max', '.0f')}, refused {m.get('train/stale_samples_refused', 0):.0f} | "
          f"sync {m.get('perf/sync_ms', 0):.0f}ms", flush=True)


def register_train_command(sub: Any) -> None:
    from openclaw_rl.cli import add_serve_flags

    from .hf_policy import add_policy_arguments

    p = sub.add_parser("train", help="proxy + embedded trainer against an external SGLang server (no Slime)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_serve_flags(p)
    p.add_argument("--model", required=True, help="HF checkpoint the policy server was launched from")
    add_policy_arguments(p)
    p.add_argument("--batch-size", type=int, default=ExternalConfig.rollout_batch_size, help="samples per step")
    p.add_argument("--lr", type=float, default=ExternalConfig.lr, help="1e-6 to 1e-5 for 0.6B-4B; 5e-4 tiny model")
    p.add_argument("--kl-coef", type=float, default=0.0)
    p.add_argument("--max-staleness", type=int, default=ExternalConfig.max_staleness,
                   help="refuse samples sampled more than N steps ago (-1: no bound)")
    p.add_argument("--fidelity-copies", type=int, default=ExternalConfig.fidelity_copies,
                   help="weight copies kept for the rollout-fidelity metric (0 saves their memory)")
    p.add_argument("--version-check-s", type=float, default=ExternalConfig.version_check_s,
                   help="check the policy server's weight version every N s; a restarted server gets the last "
                        "synced weights back before it serves again (0: never)")
    p.add_argument("--sync-dir", default="", help="where synced weights are written (e.g. /dev/shm/openclaw)")
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="runs/train")
    p.add_argument("--simulate", type=int, default=0, metavar="N", help="drive it with N simulated-user calls")
    add_wandb_flag(p)
    from openclaw_rl.users.train_wiring import add_train_user_flags

    add_train_user_flags(p)
    p.set_defaults(fn=_cmd_train)


def _cmd_train(ns: argparse.Namespace) -> int:
    from openclaw_rl.cli import ensure_port_free, settings_from_cli

    from .hf_policy import policy_config_from_cli
    from .tiny_model import quiet_progress_bars

    if ns.save_every and ns.lora_rank:
        raise SystemExit("--save-every with --lora-rank is not supported yet (checkpoints hold full weights)")
    settings = settings_from_cli(ns)
    ensure_port_free(settings.proxy.host, settings.proxy.port, "--port (openclaw_proxy_port)")  # before the model loads
    cfg = ExternalConfig(model=ns.model, settings=settings, policy=policy_config_from_cli(ns),
                         out_dir=ns.out_dir, sync_dir=ns.sync_dir, rollout_batch_size=ns.batch_size, lr=ns.lr,
                         kl_coef=ns.kl_coef, max_staleness=ns.max_staleness, fidelity_copies=ns.fidelity_copies,
                         max_steps=ns.max_steps, save_every=ns.save_every, seed=ns.seed,
                         simulate_interactions=ns.simulate, version_check_s=ns.version_check_s,
                         wandb_project=ns.wandb, per_user_adapters=ns.per_user_adapters,
                         adapter_rank=ns.adapter_rank, adapter_min_samples=ns.adapter_min_samples)
    if cfg.per_user_adapters:
        if ns.lora_rank:
            raise SystemExit("--per-user-adapters trains one LoRA per user on the frozen base; --lora-rank (one "
                             "shared LoRA merged into full weights) cannot be combined with it")
        settings.proxy.per_user_adapters = True
    # transformers' bars ("Loading weights" at the start, "Writing model shards" at every sync) would
    # redraw in the step log at every step; the step lines say what happened
    with sigterm_as_ctrl_c(), quiet_progress_bars():
        report = run_train(cfg)
    print(json.dumps(asdict(report), indent=2))
    return 0
