"""``openclaw-rl local``: the whole system on one CPU machine, with one command.

Starts, in one process: the tiny policy behind the SGLang-compatible engine, the judge (rules for the
votes, a frozen copy of the initial policy as the OPD teacher) behind a second engine, the proxy, and the
embedded trainer; optionally the simulated users. The training loop is Slime's ``train_async`` with an
update interval of 1: batch k+1 is collected while step k trains, and the weights are synced with
submission paused, after batch k+1 is full. Ctrl-C or SIGTERM stops everything (requests in flight
finish, the report is written); samples not yet trained stay in the durable spool. The next run on the
same output directory trains them first if it resumes a checkpoint (``--save-every``) of the same tiny
model; one that starts from the untrained model, or serves the other one, moves them, with the earlier
run's metrics, to ``previous/`` instead (``set_aside_earlier_run``). Its command line: ``local_command.py``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openclaw_rl.embedded.interrupts import name_of, while_starting
from openclaw_rl.embedded.local_console import _print_step, add_simulation_metrics, make_progress
from openclaw_rl.embedded.metric_sinks import wandb_config
from openclaw_rl.embedded.write_failure import WriteFailed
from openclaw_rl.modes import MODES
from openclaw_rl.spool import Spool

if TYPE_CHECKING:
    from openclaw_rl.runtime import ProxyRuntime

log = logging.getLogger(__name__)


@dataclass
class LocalConfig:
    mode: str = "rl"
    preset: str = "h128"
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = 30000  # the proxy; engines take free loopback ports
    out_dir: str = "runs/local"
    rollout_batch_size: int = 8
    lr: float = 5e-4  # measured: 2e-3 learns faster, then collapses onto a degenerate reply
    kl_coef: float = 0.0  # KL to the initial weights (Slime's --kl-loss-coef); guards against collapse
    distill_topk: int = 0
    hint_selection: str = "longest"  # opd/combine: which candidate hint's teacher signal a sample keeps
    distill_subset: str = "teacher"  # opd top-K: which ids the loss compares
    combine_loss: str = "ppo"  # combine: ppo, or topk_select (upstream's recommended method; K defaults to 4)
    teacher_url: str = ""  # opd/combine: a teacher server instead of the embedded frozen copy
    teacher_source: str = "server"  # opd/combine/oel: trainer = the teacher runs in the trainer (frozen_teacher.py)
    teacher_checkpoint: str = ""  # teacher_source trainer: another checkpoint (same tokenizer) as the teacher
    max_steps: int = 0  # 0 = until the simulation ends (or Ctrl-C without --simulate)
    judge_votes: int = 1  # the rule judge is deterministic: one vote is as good as m
    judge_hints: str = "one"  # several: vote k gets a precise / vague / verbose hint (hint_judge.py), 3 votes
    save_every: int = 0
    simulate: bool = False
    interactions: int = 320
    concurrency: int = 8
    preferred_style: str = ""  # empty: the task's default preference
    max_new_tokens: int = 64
    session_ttl_s: float = 900.0  # as `serve`: a person (or a 4-minute OpenClaw turn) may answer late
    openclaw_model: bool = False  # serve the variant pre-trained on OpenClaw-shaped prompts (the CLI's default)
    # The trainer subtracts the batch's mean reward from the advantages (Slime's GRPO normalization over
    # the batch as one group, instead of rl mode's --disable-rewards-normalization). With A = r, a batch that is mostly
    # corrected (-1) pushes down every token its replies share, the reply format included: on OpenClaw's
    # prompt the replies then drifted to bare `<think>` and runs of dashes (measured); centred, a shared
    # token's pushes cancel and only what differs between the replies moves.
    center_rewards: bool = False
    wandb_project: str = ""  # --wandb: also log the step metrics to this W&B project
    api_keys: list[str] = field(default_factory=list)  # the proxy's bearer keys (none: loopback, no key)
    per_user_adapters: bool = False  # one LoRA adapter per user on the frozen base (local_users.py)
    user_groups: str = ""  # --simulate with groups of users of different preferences ("formal:2,casual:2")
    adapter_rank: int = 8
    adapter_min_samples: int = 1


@dataclass
class LocalReport:
    mode: str
    steps: int
    interactions: int
    baseline_rate: float | None = None  # simulated users: preferred rate over the first window of fresh requests
    final_rate: float | None = None  # … and over the last window
    opening_rate_first: float | None = None  # simulated users: sessions' first replies, first window of sessions
    opening_rate_last: float | None = None  # … and last window (no correction in their history to follow)
    preferred_prob_before: float | None = None  # exact probability of the preferred opener, untrained policy
    preferred_prob_after: float | None = None  # … and after training (32 fresh requests, no sampling noise)
    logprob_abs_diff: list[float] = field(default_factory=list)  # same weights: numerical mismatch only
    stale_logprob_abs_diff: list[float] = field(default_factory=list)  # Slime's metric: + one-step staleness
    curve_png: str | None = None
    metrics_path: str = ""
    seconds: float = 0.0
    untrained_samples: int = 0  # left in the spool at the end (see the module docstring for what comes of them)
    report_path: str = ""  # this report, as JSON (the console prints its path and a summary, not the JSON)
    log_path: str = ""  # the run's log: one line per dropped turn, with its reason
    group_rates: dict[str, list[float]] = field(default_factory=dict)  # --user-groups: style -> [first, last]


def summary_text(report: LocalReport) -> str:
    """The few lines the console shows at the end; the whole report is in ``report.report_path``."""
    lines = [f"done: {report.steps} steps in {report.seconds:.0f}s"
             + (f", {report.interactions} simulated replies" if report.interactions else "")]
    if report.preferred_prob_before is not None and report.preferred_prob_after is not None:
        lines.append(f"probability of the preferred opener: {report.preferred_prob_before:.0%} -> "
                     f"{report.preferred_prob_after:.0%}")
    lines.append(f"report: {report.report_path}")
    lines.append(f"log (one line per dropped turn): {report.log_path}")
    lines.append(f"metrics: {report.metrics_path} (openclaw-rl dashboard --spool-dir "
                 f"{Path(report.metrics_path).parent / 'spool'} shows them)")
    return "\n".join(lines)


def provider_json(url: str, model: str, api_key: str = "local", *, context_window: int = 32768,
                  max_tokens: int = 256) -> dict[str, Any]:
    """What to paste into ``~/.openclaw/openclaw.json`` so OpenClaw talks to the proxy.

    ``context_window`` must be the policy engine's real context: OpenClaw refuses a prompt larger than
    it ("Context overflow"), and its own prompt alone is ~51K characters.
    """
    return {"models": {"mode": "merge", "providers": {"openclaw-rl": {
        "baseUrl": f"{url}/v1", "apiKey": api_key, "api": "openai-completions",
        "models": [{"id": model, "name": model, "reasoning": False, "input": ["text"],
                    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                    "contextWindow": context_window, "maxTokens": max_tokens,
                    "compat": {"sendSessionAffinityHeaders": True, "supportsPromptCacheKey": True}}]}}},
        "agents": {"defaults": {"model": {"primary": f"openclaw-rl/{model}"}}}}


RUN_MODEL_FILE = "model.json"  # in the output directory: which tiny model its spool and checkpoints belong to


def set_aside_earlier_run(out: Path, model: str) -> tuple[Path, str] | None:
    """Move an earlier run's files out of the way when this run cannot continue it.

    A run continues the one before it in ``out`` when it resumes that run's checkpoint: same model (the
    tiny model's directory name, kept in ``out/model.json``) and a finished checkpoint under
    ``out/checkpoints``. Otherwise the samples the earlier run left in ``out/spool`` were sampled by weights
    this trainer never had (labelled ``step-34`` while it is at step 0, or by the other tiny model: the
    plain one of ``--simulate`` against the OpenClaw variant), its ``metrics.jsonl`` counts steps this run
    would count again, and another model's checkpoint must not be loaded. They go to
    ``out/previous/<UTC time>/``: nothing is deleted, nothing is trained on the wrong model. Returns where
    they went and why, or None when there was nothing to move or a run to resume."""
    marker = out / RUN_MODEL_FILE
    try:
        earlier_model = json.loads(marker.read_text()).get("model") if marker.exists() else None
    except (OSError, ValueError, AttributeError):
        earlier_model = None
    from .trainer import run_has_checkpoint

    resumable = run_has_checkpoint(out / "checkpoints")
    other_model = earlier_model is not None and earlier_model != model
    moved: tuple[Path, str] | None = None
    if other_model or not resumable:
        earlier = [p for p in out.iterdir() if p.name != "previous" and (other_model or p.name != "checkpoints")]
        if earlier:
            target = out / "previous" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
            while target.exists():  # two runs started within one second
                target = target.with_name(target.name + "+")
            target.mkdir(parents=True)
            for path in earlier:
                path.rename(target / path.name)
            moved = (target, f"it was a run of another model ({earlier_model})" if other_model
                     else "it left no checkpoint to resume")
    marker.write_text(json.dumps({"model": model}) + "\n")
    return moved


class LocalStack:
    """Owns every server and thread of a local run; ``close()`` stops them all."""

    def __init__(self, cfg: LocalConfig):
        from transformers import AutoTokenizer

        from openclaw_rl.embedded.tiny_model import ensure_tiny_model, quiet_progress_bars

        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        model_dir = ensure_tiny_model(cfg.preset, seed=cfg.seed, openclaw=cfg.openclaw_model,
                                      log=lambda line: print(line, flush=True))
        set_aside = set_aside_earlier_run(self.out, model_dir.name)
        if set_aside is not None:
            print(f"{self.out} holds an earlier run this one cannot continue ({set_aside[1]}): its files moved to "
                  f"{set_aside[0]} (its samples were sampled by that run's weights, not this model's; "
                  "--save-every N checkpoints a run so that the next one resumes it)", flush=True)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.servers: list[Any] = []
        self.cores: list[Any] = []  # the engines' torch cores (policy, teacher): their worker threads end on close
        self.runtime: ProxyRuntime | None = None
        self.stop_event = threading.Event()
        try:
            with quiet_progress_bars():
                self._start(cfg, model_dir)
        except BaseException:  # Ctrl-C while the models load, or a failed start: stop what did start
            self.close()
            raise

    def _start(self, cfg: LocalConfig, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        from openclaw_rl.config import load_settings
        from openclaw_rl.embedded.hint_judge import VOTES as HINT_VOTES
        from openclaw_rl.embedded.hint_judge import judge_core
        from openclaw_rl.engine.app import make_engine_app
        from openclaw_rl.engine.torch_core import TorchModel
        from openclaw_rl.runtime import ProxyRuntime
        from openclaw_rl.servers import BackgroundServer

        from .frozen_teacher import trainer_teacher_source, trainer_topk
        from .trainer import EmbeddedTrainer, TrainerConfig

        self.policy = TorchModel.from_pretrained(str(model_dir), seed=cfg.seed)
        self.cores.append(self.policy)
        # streamed as the launch scripts run SGLang (--incremental-streaming-output): linear in the reply length
        policy_app = make_engine_app(self.policy, self.tokenizer, served_model_name="tiny", model_path=str(model_dir),
                                     incremental_streaming_output=True)
        self.policy_server = self._serve(BackgroundServer(policy_app, cfg.host))
        teacher = TorchModel.from_pretrained(str(model_dir), seed=cfg.seed + 1)  # frozen initial policy
        self.cores.append(teacher)
        judge_app = make_engine_app(judge_core(cfg.judge_hints, self.tokenizer, teacher, cfg.seed), self.tokenizer,
                                    served_model_name="rule-judge", model_path=str(model_dir))
        self.judge_server = self._serve(BackgroundServer(judge_app, cfg.host))
        from .local_users import make_user_trainer, user_settings

        settings = load_settings({
            **({"proxy_api_keys": list(cfg.api_keys)} if cfg.api_keys else {}), **user_settings(cfg),
            "mode": cfg.mode, "proxy_host": cfg.host, "proxy_port": cfg.port, "proxy_tokenizer": str(model_dir),
            "proxy_policy_url": self.policy_server.url, "judge_url": self.judge_server.url,
            "judge_votes": max(cfg.judge_votes, HINT_VOTES) if cfg.judge_hints == "several" else cfg.judge_votes,
            "judge_max_new_tokens": 128, "spool_dir": str(self.out / "spool"),
            "proxy_record_dir": str(self.out / "records"), "proxy_pause_mode": "hold",
            "proxy_max_new_tokens": cfg.max_new_tokens, "proxy_served_model_name": "tiny",
            "proxy_rollout_temperature": 1.0, "opd_distill_topk": cfg.distill_topk, "proxy_session_ttl_s": cfg.session_ttl_s,
            "opd_hint_selection": cfg.hint_selection, "opd_distill_subset": cfg.distill_subset,
            "opd_teacher_url": cfg.teacher_url, "combine_loss": cfg.combine_loss,
            "opd_teacher_source": cfg.teacher_source, "opd_teacher_checkpoint": cfg.teacher_checkpoint,
        }, env={})
        self.runtime = ProxyRuntime(settings, tokenizer=self.tokenizer)
        self.metrics_path = str(self.out / "metrics.jsonl")
        self.runtime.proxy.dashboard.metrics_path = Path(self.metrics_path)  # /dashboard's training curves
        trainer_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
        tcfg = TrainerConfig(mode=cfg.mode, rollout_batch_size=cfg.rollout_batch_size, lr=cfg.lr, kl_coef=cfg.kl_coef,
                             center_rewards=cfg.center_rewards, save_every=cfg.save_every,
                             distill_topk=trainer_topk(settings, cfg.distill_topk),
                             distill_subset=cfg.distill_subset, combine_loss=cfg.combine_loss,
                             teacher_source=trainer_teacher_source(settings),
                             teacher_checkpoint=cfg.teacher_checkpoint,
                             ckpt_dir=str(self.out / "checkpoints"), metrics_path=self.metrics_path,
                             tensorboard_dir=str(self.out / "tensorboard"), seed=cfg.seed,
                             wandb=wandb_config(cfg.wandb_project, "local", str(self.out)))
        if cfg.per_user_adapters:
            self.trainer = make_user_trainer(self, tcfg, trainer_model)
        else:
            self.trainer = EmbeddedTrainer(tcfg, trainer_model, sync=self.policy.load_state_dict, tokenizer=self.tokenizer)

    def _serve(self, server: Any) -> Any:
        server.start()
        self.servers.append(server)
        return server

    @property
    def url(self) -> str:
        return self.runtime.url

    def close(self) -> None:
        self.stop_event.set()
        if self.runtime is not None:
            self.runtime.stop()
        if getattr(self, "trainer", None) is not None:
            self.trainer.close()
        for server in reversed(self.servers):
            server.stop()
        for core in self.cores:
            core.close()


def _collect(stack: LocalStack, n: int, bar: Any = None) -> Any:
    """Collect a batch, or None when the run is stopping."""
    return stack.runtime.collect(n, stop=stack.stop_event, on_progress=bar.update if bar is not None else None)


Users = Callable[[str, threading.Event, dict[str, Any]], None]
"""Drives the proxy at a URL until done (see ``simulate.drive_simulation`` for the `out` protocol)."""


def run_local(cfg: LocalConfig, *, progress: bool = True, users: Users | None = None) -> LocalReport:
    """Serve and train until `cfg.max_steps`, the users' end, or Ctrl-C / SIGTERM.

    `users` replaces the simulated users of ``cfg.simulate`` (e.g. the OpenClaw replay of
    ``openclaw_replay``); it runs in a background thread.
    """
    started = time.monotonic()
    with while_starting():
        stack = LocalStack(cfg)
    report = LocalReport(cfg.mode, 0, 0, metrics_path=stack.metrics_path)
    report.log_path = str(attach_run_log(stack.out))
    print(f"dashboard: {stack.url}/dashboard", flush=True)
    print(f"openclaw-rl local ({cfg.mode}): proxy at {stack.url}/v1  (policy engine {stack.policy_server.url}, "
          f"judge {stack.judge_server.url})", flush=True)
    if users is None and not cfg.simulate:  # only a person with OpenClaw needs the provider block
        print("OpenClaw provider config (~/.openclaw/openclaw.json):\n" +
              json.dumps(provider_json(stack.url, "tiny", context_window=stack.policy.context_length,
                                       max_tokens=cfg.max_new_tokens), indent=2), flush=True)
    sim_result: dict[str, Any] = {}
    sim_thread = None
    if users is None and cfg.simulate:
        users = lambda url, stop, out: _simulate(stack, cfg, out, progress)  # noqa: E731
    pool = ThreadPoolExecutor(1, thread_name_prefix="collect")
    bar = make_progress(progress)
    unlogged: dict[str, float] | None = None  # a trained step whose metrics line waits for the weight sync
    drops_seen: Counter[str] = Counter()  # dropped turns by reason up to the last step line
    failed: WriteFailed | None = None
    try:
        report.preferred_prob_before = None if cfg.user_groups else _preferred_probability(stack, cfg)
        if users is not None:
            sim_thread = threading.Thread(target=users, args=(stack.url, stack.stop_event, sim_result), daemon=True)
            sim_thread.start()
        pending: Future = pool.submit(_collect, stack, cfg.rollout_batch_size, bar)
        current = pending.result()
        while current is not None and not stack.stop_event.is_set():
            pending = pool.submit(_collect, stack, cfg.rollout_batch_size, bar)  # batch k+1 fills while k trains
            result = stack.trainer.train(current.samples, current.metrics)
            # counted now, and logged even if Ctrl-C comes while the next batch fills (see finally)
            unlogged, report.steps = result.metrics, result.step
            add_simulation_metrics(result.metrics, sim_result)
            drops_now = Counter(stack.runtime.proxy.journal.drops)
            if progress:  # now, not after the next batch has filled (that may take minutes of chat)
                _print_step(result.step, result.metrics, sim_result, bar, drops_now - drops_seen)
            drops_seen = drops_now
            diff = result.metrics.get("train/rollout_fidelity_abs_diff")
            if diff is not None:
                report.logprob_abs_diff.append(diff)
            report.stale_logprob_abs_diff.append(result.metrics.get("train/train_rollout_logprob_abs_diff", 0.0))
            nxt = pending.result()  # Slime syncs only once the next batch is complete (gate closed)
            result.metrics["perf/sync_ms"] = stack.trainer.sync()  # from here on, unlogged metrics are of a synced step
            stack.runtime.ack(current.batch_id, result.step)
            stack.trainer.log(result.metrics)  # (a Ctrl-C landing between this write and the next line logs
            unlogged = None  # the step twice: a duplicate line, the lesser harm than a missing one)
            current = nxt
            if cfg.max_steps and result.step >= cfg.max_steps:
                break
            if users is not None and sim_result.get("done"):
                break
    except KeyboardInterrupt as exc:
        why = name_of(exc)
        print(f"\ninterrupted ({why}): stopping (untrained samples stay in the spool)", flush=True)
    except WriteFailed as exc:  # a full disk: stop as on SIGTERM, then `openclaw-rl` prints the one line
        failed = exc
    finally:
        if unlogged is not None and failed is None:  # printed and counted, so logged too
            if "perf/sync_ms" in unlogged:  # Ctrl-C came during the ack: synced, its batch maybe acknowledged
                stack.trainer.log(unlogged)
            else:  # never synced: its batch stays in the spool
                stack.trainer.log({**unlogged, "interrupted_before_sync": 1.0})
        stack.stop_event.set()
        stack.runtime.proxy.gate.open()  # no more weight syncs: let requests held at the gate finish
        loop, task = sim_result.get("loop"), sim_result.get("task")
        if loop is not None and task is not None and not task.done():
            loop.call_soon_threadsafe(task.cancel)  # the simulated users stop; their results so far count
        if sim_thread is not None:
            sim_thread.join(60)
        pool.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()
        stack.close()
    spool = Spool(stack.out / "spool")  # read once the proxy has settled and closed its own
    report.untrained_samples = spool.depth()
    spool.close()
    report.preferred_prob_after = None if cfg.user_groups else _preferred_probability(stack, cfg)
    sim = sim_result.get("result") or sim_result.get("live")
    if sim is not None:
        report.interactions = len(sim.interactions)
        report.baseline_rate, report.final_rate = sim.first_window_rate, sim.last_window_rate
        report.opening_rate_first, report.opening_rate_last = sim.opening_rates()
        if hasattr(sim, "group_rates"):
            report.group_rates = {k: list(v) for k, v in sim.group_rates().items()}
        report.curve_png = str(stack.out / "learning_curve.png")
        try:
            sim.save_plot(report.curve_png)
        except Exception as exc:  # noqa: BLE001 - a full disk (matplotlib raises its own types): say so, go on
            log.warning("learning curve not written: %s", exc)
            report.curve_png = ""
    report.seconds = time.monotonic() - started
    report.report_path = str(stack.out / "report.json")
    try:
        (stack.out / "report.json").write_text(json.dumps(asdict(report), indent=2))
    except OSError as exc:
        log.warning("report.json not written: %s", exc)
    detach_run_log()
    if failed is not None:
        raise failed
    return report


def _preferred_probability(stack: LocalStack, cfg: LocalConfig) -> float:
    from openclaw_rl.embedded import task
    from openclaw_rl.embedded.pretrain import style_probabilities

    prompts = [[{"role": "user", "content": r.text}] for r in task.REQUESTS[:32]]
    model = stack.trainer.model
    was_training = model.training
    model.eval()
    try:
        return style_probabilities(model, stack.tokenizer, prompts)[cfg.preferred_style or task.DEFAULT_STYLE]
    finally:
        model.train(was_training)


def _simulate(stack: LocalStack, cfg: LocalConfig, out: dict[str, Any], progress: bool) -> None:
    from openclaw_rl.embedded.simulate import drive_simulation

    if cfg.user_groups:
        from .local_users import simulate_groups

        simulate_groups(stack, cfg, out)
        return
    kwargs: dict[str, Any] = {}
    if cfg.preferred_style:
        kwargs["preferred_style"] = cfg.preferred_style
    drive_simulation(stack.url, stack.stop_event, out, interactions=cfg.interactions, concurrency=cfg.concurrency,
                     seed=cfg.seed, window=40, **kwargs)


# Tuned on this task (seed 0, 2 CPU cores; README.md has the learning curves), one entry per registered mode.
MODE_DEFAULTS: dict[str, dict[str, float]] = {name: asdict(m.local) for name, m in MODES.items()}
TOPK_SELECT_K = 4  # upstream's run_qwen3_4b_openclaw_topk_select.sh (OPENCLAW_TOPK_K)


LOG_FILE = "local.log"
_LOG_HANDLER = "openclaw-local-log"


def configure_local_logging() -> None:
    """A quiet console: warnings and errors only (the step lines, the progress line and the summary are
    printed); per-request HTTP lines off; every dropped turn (a turn that trains nothing) logged at INFO,
    with its reason, to the run's log file (``attach_run_log``), the console gets counts per step."""
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    logging.getLogger("openclaw_rl.drops").setLevel(logging.INFO)
    for handler in logging.getLogger().handlers:
        if handler.get_name() != _LOG_HANDLER and isinstance(handler, logging.StreamHandler) \
                and not isinstance(handler, logging.FileHandler):
            handler.setLevel(max(handler.level, logging.WARNING))


def attach_run_log(out: Path) -> Path:
    """Everything at INFO and above (one line per dropped turn included) to ``out/local.log``, appended.
    Attached once the earlier run's files were set aside, so the file belongs to this run."""
    path = out / LOG_FILE
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == _LOG_HANDLER:
            root.removeHandler(handler)
            handler.close()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.set_name(_LOG_HANDLER)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    return path


def detach_run_log() -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == _LOG_HANDLER:
            root.removeHandler(handler)
            handler.close()
