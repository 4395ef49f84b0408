"""Drive one launch variant through a Slime's own code on CPU (run by test_slime_cpu.py, one process per rank).

Works with THUDM/slime (checked at 624b824) and with the Slime bundled in Gen-Verse/OpenClaw-RL (0d034dd);
where their internals differ (device API, ``RolloutManager`` attributes, the loss's signature, the timer's
module), the driver asks the installed Slime which one it has.

    python slime_cpu_driver.py DRY_RUN_OUTPUT MODE TP RESULT_JSON

1. The launch script's printed ``train_async.py`` command line (and its runtime env) through Slime's real
   ``parse_args`` (Megatron's parser and validation included).
2. Slime's real ``RolloutManager.generate`` (rank 0): it loads our rollout function from the parsed
   ``--rollout-function-path`` and calls it; our function starts the project's proxy in-process against
   the project's scripted SGLang policy and judge (``tests/support.py``), while this driver chats a few
   sessions through the proxy so turns get next states and are judged. ``generate`` then runs Slime's
   ``log_rollout_data``, ``_convert_samples_to_train_data`` and ``_split_train_data_by_dp``; the train
   data goes to the other TP ranks by a gloo broadcast. The samples are checked token for token against
   what the scripted policy sampled (and, for OPD, what the hint-aware teacher scored).
3. Slime's ``MegatronTrainRayActor._get_rollout_data`` and ``train_actor`` (its own choice whether to
   recompute old log-probs, ``compute_advantages_and_returns`` with our advantage hook, the rollout-data
   postprocess hook, ``log_rollout_data``), with Megatron's ``parallel_state`` on gloo at TP = ``TP``.
4. In place of the Megatron model, a fixed table ``E[token] -> logits`` (each TP rank holds its vocab
   columns, like Megatron's vocab-parallel output layer); Slime's ``get_log_probs_and_entropy`` recomputes
   old log-probs from it, and Slime's ``get_batch`` + ``loss_function`` (our custom losses where the script
   names one) + backward train it.

Stand-ins (see docs/deployment.md): ``ray.put``/``ray.get`` pass objects through (no cluster); the
``RolloutManager`` is built without its ``__init__`` (which starts SGLang engines, a router and a Ray
``Lock`` actor): its attributes are set as ``__init__`` sets them with ``--debug-train-only``-style empty
``servers`` (the rollout function reaches the scripted engines through ``sglang_router_ip/port``, which
Slime itself fills in once its router is up); the
accelerator is a CPU backend given to Slime's ``set_accelerator``, Megatron's GPU-architecture query answers 9 (Hopper), the model is the
table above, and SGLang / torch_memory_saver / wandb are import-only stubs (slime_cpu_stubs/).

Stage: launch script → **Slime on CPU** (parse, rollout, train) → the result JSON ``test_slime_cpu.py``
asserts on. This module parses and runs the trainer side (3); the rollout side (2) is
``slime_cpu_rollout.py``, the table and the CPU device (4) ``slime_cpu_standins.py``, the checks of the
teacher log-probs the loss read ``slime_cpu_reports.py`` (siblings: this script's directory is
``sys.path[0]``).
"""

from __future__ import annotations

import inspect
import json
import os
import shlex
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist
from slime_cpu_reports import megatron_teacher_report, trainer_teacher_report
from slime_cpu_rollout import STUDENT_IDS_ENV, rollout_through_slime
from slime_cpu_standins import TEACHER_SEED, TableModel, cpu_device


def slime_argv(dry_run_output: str) -> tuple[list[str], dict[str, str]]:
    lines = dry_run_output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ray job submit"))
    joined = []
    for line in lines[start:]:
        joined.append(line[:-2] if line.endswith(" \\") else line)
        if not line.endswith(" \\"):
            break
    words = shlex.split(" ".join(joined))
    env = json.loads(words[words.index("--runtime-env-json") + 1])["env_vars"]
    # after "--": the python, train_async.py, then the flags
    return words[words.index("--") + 3 :], {k: v for k, v in env.items() if k != "PYTHONPATH"}


def parse_slime_args(argv: list[str], env: dict[str, str]):
    os.environ.update(env)
    import megatron.training.arguments as megatron_arguments
    import megatron.training.utils as megatron_utils

    megatron_utils.get_device_arch_version = megatron_arguments.get_device_arch_version = lambda: 9  # no GPU to ask
    from slime.utils.arguments import parse_args

    sys.argv = ["train_async.py", *argv]
    return parse_args()


def main(dry_run_output: str, mode: str, tp: int, result_path: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    argv, env = slime_argv(Path(dry_run_output).read_text())
    args = parse_slime_args(argv, env)
    result: dict = {"parsed": {k: getattr(args, k, None) for k in (
        "rollout_function_path", "loss_type", "custom_loss_function_path", "custom_advantage_function_path",
        "rollout_data_postprocess_path", "advantage_estimator", "save", "save_interval", "tensor_model_parallel_size",
        "context_parallel_size",
        "use_rollout_logprobs", "compute_advantages_and_returns", "use_opd", "opd_type")}}

    import slime.ray.rollout as slime_rollout
    import slime.utils.data as slime_data
    from megatron.core import parallel_state
    from slime.backends.megatron_utils import actor as slime_actor
    from slime.backends.megatron_utils import data as slime_megatron_data
    from slime.backends.megatron_utils.loss import get_log_probs_and_entropy, loss_function
    from slime.utils.misc import load_function

    if os.environ.get(STUDENT_IDS_ENV):
        args.openclaw_opd_distill_subset = "student"  # the launch refuses it (the proxy's side is not built)
    passthrough = types.SimpleNamespace(put=lambda obj, **_: obj, get=lambda ref, **_: ref)
    slime_rollout.ray, slime_data.ray = passthrough, passthrough  # no Ray cluster: objects are passed through
    cpu_device()

    cp = int(getattr(args, "context_parallel_size", 1) or 1)  # CONTEXT_PARALLEL: tp x cp gloo ranks
    dist.init_process_group("gloo", rank=rank, world_size=tp * cp)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, context_parallel_size=cp)
    from openclaw_rl.losses.logprobs import active_tp_group

    result["tp_group_size"] = 1 if active_tp_group() is None else dist.get_world_size(active_tp_group())

    # --- rollout side: Slime's RolloutManager.generate calling our rollout function (rank 0) -------------
    vocab = int(args.vocab_size)
    shared: list = [None]
    if rank == 0:
        refs, result["rollout"] = rollout_through_slime(args, mode, slime_rollout, load_function)
        shared[0] = refs
    dist.broadcast_object_list(shared, src=0)  # every TP rank trains on the same rollout
    refs = shared[0]

    # --- actor side: Slime's train_actor with a table in place of the Megatron model ---------------------
    model = TableModel(vocab, tp, parallel_state.get_tensor_model_parallel_rank())
    actor_cls = getattr(slime_actor.MegatronTrainRayActor, "__ray_actor_class__", slime_actor.MegatronTrainRayActor)
    actor = object.__new__(actor_cls)
    actor.args = args
    # THUDM/slime's built-in Megatron OPD (--use-opd --opd-type megatron): a second table stands in for the
    # teacher checkpoint; Slime's own _switch_model swaps it in through the weights backuper.
    tables = {"actor": model}
    if getattr(args, "use_opd", False) and args.opd_type == "megatron":
        tables["teacher"] = TableModel(vocab, tp, parallel_state.get_tensor_model_parallel_rank(), seed=TEACHER_SEED)
    active = [model]
    actor.weights_backuper = types.SimpleNamespace(backup_tags=set(tables), backup=lambda tag: None,
                                                   restore=lambda tag: active.__setitem__(0, tables[tag]))
    actor._active_model_tag = "actor"
    actor.rollout_data_postprocess = (load_function(args.rollout_data_postprocess_path)
                                      if args.rollout_data_postprocess_path else None)
    actor.prof = types.SimpleNamespace(step=lambda **_: None)
    actor.weight_updater = types.SimpleNamespace(pop_metrics=lambda: {})
    recomputed: list[str] = []

    def compute_log_prob(data_iterator, num_microbatches, store_prefix=""):
        recomputed.append(store_prefix or "old")
        out: dict[str, list[torch.Tensor]] = {}
        data_iterator[0].reset()
        for _ in range(sum(num_microbatches)):
            batch = slime_megatron_data.get_batch(data_iterator[0], ["tokens", "total_lengths", "response_lengths",
                                                                      "loss_masks"], args.data_pad_size_multiplier)
            with torch.no_grad():
                _, got = get_log_probs_and_entropy(active[0](batch["tokens"]), args=args, unconcat_tokens=batch["unconcat_tokens"],
                                                total_lengths=batch["total_lengths"],
                                                response_lengths=batch["response_lengths"])
            out.setdefault(f"{store_prefix}log_probs", []).extend(got["log_probs"])
        data_iterator[0].reset()
        return out

    actor.compute_log_prob = compute_log_prob
    losses: list[dict] = []
    loss_teacher: dict[tuple, torch.Tensor] = {}

    # Current Slime's loss also takes the step's global batch size (the bundled Slime's has no such argument).
    takes_batch_size = "step_global_batch_size" in inspect.signature(loss_function).parameters

    def train(rollout_id, _model, _optimizer, _scheduler, data_iterator, num_microbatches, global_batch_sizes=None):
        keys = ["tokens", "total_lengths", "response_lengths", "loss_masks", "log_probs", "ref_log_probs", "values",
                "advantages", "returns", "rollout_log_probs", "teacher_log_probs", "rollout_mask_sums",
                "teacher_topk_log_probs", "teacher_topk_indices"]  # the last two: forwarded by the bundled Slime
        data_iterator[0].reset()
        for step, count in enumerate(num_microbatches):
            for _ in range(count):
                batch = slime_megatron_data.get_batch(data_iterator[0], keys, args.data_pad_size_multiplier)
                sizes = (global_batch_sizes[step],) if takes_batch_size else ()
                for tokens, teacher in zip(batch["unconcat_tokens"], batch.get("teacher_log_probs") or [], strict=False):
                    loss_teacher[tuple(int(t) for t in tokens)] = (  # what the loss reads, top-K attributes too
                        teacher.detach().clone(), getattr(teacher, "openclaw_teacher_topk_log_probs", None),
                        getattr(teacher, "openclaw_teacher_topk_indices", None))
                loss, _normalizer, log = loss_function(args, batch, count, *sizes, model(batch["tokens"]))
                loss.backward()
                losses.append({"loss": float(loss), **{k: float(v) for k, v in zip(log["keys"], log["values"][1:], strict=True)}})

    slime_actor.train = train
    # timers of a real GPU step (the bundled Slime imports log_perf_data into the actor module)
    perf_owner = getattr(slime_actor, "train_metric_utils", slime_actor)
    perf_owner.log_perf_data = lambda *a, **k: None
    seen: dict = {}
    original_get = actor_cls._get_rollout_data
    original_process = slime_actor.process_rollout_data

    def process_rollout_data(*a, **k):  # this rank's samples before Slime's context-parallel slice
        data = original_process(*a, **k)
        seen["sample_teacher"] = [torch.as_tensor(t).detach().clone() for t in data.get("teacher_log_probs", [])]
        return data

    slime_actor.process_rollout_data = process_rollout_data

    def get_rollout_data(ref):  # also what the Samples carried as teacher log-probs, before Slime's own teacher
        return seen.setdefault("data", original_get(actor, ref))

    actor._get_rollout_data = get_rollout_data
    actor.role = "actor"
    actor.model = actor.optimizer = actor.opt_param_scheduler = None  # the table stands in (see train below)
    try:
        from slime.observability.timer import Timer
    except ImportError:  # the bundled Slime
        from slime.utils.timer import Timer

    Timer().start("train_wait")  # started by Slime after each weight update
    actor.train(0, refs)
    rollout_data = seen["data"]

    if cp > 1:  # each CP rank's loss_function sees its rows only: the sums over the CP group, as Slime reduces them
        group = parallel_state.get_context_parallel_group()
        summed = []
        for step in losses:
            values = torch.tensor([step[k] for k in sorted(step)], dtype=torch.float64)
            dist.all_reduce(values, group=group)
            summed.append(dict(zip(sorted(step), values.tolist(), strict=True)))
        result["losses_cp_rank0"], losses = losses, summed
    grad = model.weight.grad
    result.update(recomputed=recomputed, losses=losses, grad_abs_sum=float(grad.abs().sum()) if grad is not None else 0.0,
                  grad_finite=bool(grad is not None and torch.isfinite(grad).all()),
                  rollout_data_keys=sorted(k for k in rollout_data if isinstance(rollout_data[k], list)),
                  teacher_dims=sorted({t.dim() for t in rollout_data.get("teacher_log_probs", [])}))
    if "teacher" in tables and tp == 1:
        result["megatron_teacher"] = megatron_teacher_report(rollout_data, seen["sample_teacher"],
                                                             tables["teacher"].weight.detach())
    if any(t.dim() == 2 and t.size(-1) % 2 == 0 for t in seen["sample_teacher"]):  # teacher_source trainer
        result["trainer_teacher"] = trainer_teacher_report(args, rollout_data, seen["sample_teacher"], loss_teacher)
        if mode == "opd":  # token-level OPD: the advantages Slime trained on are teacher - old, the filled teacher
            old = rollout_data.get("log_probs") or rollout_data["rollout_log_probs"]
            result["trainer_teacher"]["opd_adv_max_abs_diff"] = max(
                float((a.float() - (t.float()[-o.numel():] - o.float())).abs().max())
                for a, t, o in zip(rollout_data["advantages"], rollout_data["teacher_log_probs"], old, strict=True))
    if rank == 0:
        Path(result_path).write_text(json.dumps(result, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
