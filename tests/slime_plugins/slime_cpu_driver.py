"""Drive one launch variant through THUDM/slime's own code on CPU (run by test_slime_cpu.py, one process per rank).

    python slime_cpu_driver.py DRY_RUN_OUTPUT MODE TP RESULT_JSON

1. The launch script's printed ``train_async.py`` command line (and its runtime env) through Slime's real
   ``parse_args`` (Megatron's parser and validation included).
2. Our samples → Slime's ``RolloutManager._convert_samples_to_train_data`` and ``_split_train_data_by_dp``.
3. Slime's ``MegatronTrainRayActor._get_rollout_data`` and ``train_actor`` (its own choice whether to
   recompute old log-probs, ``compute_advantages_and_returns`` with our advantage hook, the rollout-data
   postprocess hook, ``log_rollout_data``), with Megatron's ``parallel_state`` on gloo at TP = ``TP``.
4. In place of the Megatron model, a fixed table ``E[token] -> logits`` (each TP rank holds its vocab
   columns, like Megatron's vocab-parallel output layer); Slime's ``get_log_probs_and_entropy`` recomputes
   old log-probs from it, and Slime's ``get_batch`` + ``loss_function`` (our custom losses where the script
   names one) + backward train it.

Stand-ins (see docs/deployment.md): ``ray.put``/``ray.get`` pass objects through (no cluster), the
accelerator is a CPU backend given to Slime's ``set_accelerator``, Megatron's GPU-architecture query answers 9 (Hopper), the model is the
table above, and SGLang / torch_memory_saver / wandb are import-only stubs (slime_cpu_stubs/).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import types
from pathlib import Path

import torch
import torch.distributed as dist

VOCAB_SEED, SAMPLE_SEED = 1234, 99


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
    return words[words.index("--") + 2 :], {k: v for k, v in env.items() if k != "PYTHONPATH"}


def parse_slime_args(argv: list[str], env: dict[str, str]):
    os.environ.update(env)
    import megatron.training.arguments as megatron_arguments
    import megatron.training.utils as megatron_utils

    megatron_utils.get_device_arch_version = megatron_arguments.get_device_arch_version = lambda: 9  # no GPU to ask
    from slime.utils.arguments import parse_args

    sys.argv = ["train_async.py", *argv]
    return parse_args()


def training_samples(mode: str, n: int, vocab: int):
    from openclaw_rl.samples import TrainingSample

    g = torch.Generator().manual_seed(SAMPLE_SEED)
    samples = []
    for i in range(n):
        prompt, response = 3 + i % 3, 2 + (i * 5) % 7
        rollout = (-torch.rand(response, generator=g)).tolist()
        extra = {}
        if mode in ("opd", "combine", "opd_topk"):
            extra["teacher_log_probs"] = rollout if (mode == "combine" and i % 2) else (-torch.rand(response, generator=g)).tolist()
        if mode == "opd_topk":
            top = torch.log_softmax(torch.randn(response, vocab, generator=g), -1).topk(3)
            extra["teacher_topk_log_probs"], extra["teacher_topk_indices"] = top.values.tolist(), top.indices.tolist()
        samples.append(TrainingSample(
            session_id=f"s{i}", turn=1, kind=mode if mode != "opd_topk" else "opd",
            prompt_ids=torch.randint(0, vocab, (prompt,), generator=g).tolist(),
            response_ids=torch.randint(0, vocab, (response,), generator=g).tolist(),
            rollout_log_probs=rollout, loss_mask=[1] * response, reward=1.0 if i % 4 else -1.0, index=i, **extra))
    return samples


class TableModel:
    """``logits[t] = E[token_t, shard]``: deterministic in the tokens, one leaf parameter per rank."""

    def __init__(self, vocab: int, tp: int, rank: int) -> None:
        # The same padded width at every TP (Megatron pads the vocabulary too), so TP=1 and TP=2 see one table.
        full = torch.randn(vocab, vocab + (-vocab) % 8, generator=torch.Generator().manual_seed(VOCAB_SEED))
        width = full.size(1) // tp
        self.weight = full[:, rank * width : (rank + 1) * width].clone().requires_grad_()

    def __call__(self, tokens_1T: torch.Tensor) -> torch.Tensor:
        return self.weight[tokens_1T]  # [1, T, V_local]


def _cpu_accelerator(accelerator_module):
    """A CPU backend for Slime's accelerator API (it registers CUDA and MUSA only)."""
    from slime.utils.accelerator.base import Accelerator

    class CPUAccelerator(Accelerator):
        def is_available(self): return True
        def device(self, index=None): return torch.device("cpu")
        def device_name(self, index=None): return "cpu"
        def set_device(self, index): pass
        def current_device(self): return "cpu"
        def device_count(self): return 1
        def synchronize(self, device=None): pass
        def current_stream(self, device=None): return None
        def empty_cache(self): pass
        def mem_get_info(self, device=None): return (0, 0)
        def memory_allocated(self, device=None): return 0
        def memory_reserved(self, device=None): return 0

    return CPUAccelerator()


def main(dry_run_output: str, mode: str, tp: int, result_path: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    argv, env = slime_argv(Path(dry_run_output).read_text())
    args = parse_slime_args(argv, env)
    result: dict = {"parsed": {k: getattr(args, k, None) for k in (
        "rollout_function_path", "loss_type", "custom_loss_function_path", "custom_advantage_function_path",
        "rollout_data_postprocess_path", "advantage_estimator", "save", "save_interval", "tensor_model_parallel_size",
        "use_rollout_logprobs", "compute_advantages_and_returns")}}

    import slime.ray.rollout as slime_rollout
    import slime.utils.data as slime_data
    from megatron.core import parallel_state
    from slime.backends.megatron_utils import actor as slime_actor
    from slime.backends.megatron_utils import data as slime_megatron_data
    from slime.backends.megatron_utils.loss import get_log_probs_and_entropy, loss_function
    from slime.utils import accelerator
    from slime.utils.misc import load_function

    passthrough = types.SimpleNamespace(put=lambda obj, **_: obj, get=lambda ref, **_: ref)
    slime_rollout.ray, slime_data.ray = passthrough, passthrough  # no Ray cluster: objects are passed through
    accelerator.set_accelerator(_cpu_accelerator(accelerator))  # Slime's own hook for a backend

    dist.init_process_group("gloo", rank=rank, world_size=tp)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    from openclaw_rl.losses.logprobs import active_tp_group

    result["tp_group_size"] = 1 if active_tp_group() is None else dist.get_world_size(active_tp_group())

    # --- rollout side: Slime's own conversion of what our rollout function returns ---------------------
    from openclaw_rl.slime_hooks.samples import to_slime_groups

    vocab = int(args.vocab_size)
    groups = to_slime_groups(training_samples(mode, int(args.rollout_batch_size), vocab))
    manager_cls = getattr(slime_rollout.RolloutManager, "__ray_actor_class__", slime_rollout.RolloutManager)
    manager = object.__new__(manager_cls)
    manager.args = args
    manager.custom_convert_samples_to_train_data_func = manager.custom_reward_post_process_func = None
    manager.train_parallel_config = {"dp_size": 1, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    train_data = manager._convert_samples_to_train_data([s for group in groups for s in group])
    refs = manager._split_train_data_by_dp(train_data)
    result["train_data_keys"] = sorted(train_data)

    # --- actor side: Slime's train_actor with a table in place of the Megatron model ---------------------
    model = TableModel(vocab, tp, parallel_state.get_tensor_model_parallel_rank())
    actor_cls = getattr(slime_actor.MegatronTrainRayActor, "__ray_actor_class__", slime_actor.MegatronTrainRayActor)
    actor = object.__new__(actor_cls)
    actor.args = args
    actor.weights_backuper = types.SimpleNamespace(backup_tags={"actor"}, backup=lambda tag: None, restore=lambda tag: None)
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
                _, got = get_log_probs_and_entropy(model(batch["tokens"]), args=args, unconcat_tokens=batch["unconcat_tokens"],
                                                total_lengths=batch["total_lengths"],
                                                response_lengths=batch["response_lengths"])
            out.setdefault(f"{store_prefix}log_probs", []).extend(got["log_probs"])
        data_iterator[0].reset()
        return out

    actor.compute_log_prob = compute_log_prob
    losses: list[dict] = []

    def train(rollout_id, _model, _optimizer, _scheduler, data_iterator, num_microbatches, global_batch_sizes):
        keys = ["tokens", "total_lengths", "response_lengths", "loss_masks", "log_probs", "ref_log_probs", "values",
                "advantages", "returns", "rollout_log_probs", "teacher_log_probs", "rollout_mask_sums"]
        data_iterator[0].reset()
        for step, count in enumerate(num_microbatches):
            for _ in range(count):
                batch = slime_megatron_data.get_batch(data_iterator[0], keys, args.data_pad_size_multiplier)
                loss, _normalizer, log = loss_function(args, batch, count, global_batch_sizes[step], model(batch["tokens"]))
                loss.backward()
                losses.append({"loss": float(loss), **{k: float(v) for k, v in zip(log["keys"], log["values"][1:], strict=True)}})

    slime_actor.train = train
    slime_actor.train_metric_utils.log_perf_data = lambda *a, **k: None  # timers of a real GPU step
    seen: dict = {}
    original_get = actor_cls._get_rollout_data
    actor._get_rollout_data = lambda ref: seen.setdefault("data", original_get(actor, ref))
    actor.role = "actor"
    actor.model = actor.optimizer = actor.opt_param_scheduler = None  # the table stands in (see train below)
    from slime.observability.timer import Timer

    Timer().start("train_wait")  # started by Slime after each weight update
    actor.train(0, refs)
    rollout_data = seen["data"]

    grad = model.weight.grad
    result.update(recomputed=recomputed, losses=losses, grad_abs_sum=float(grad.abs().sum()) if grad is not None else 0.0,
                  grad_finite=bool(grad is not None and torch.isfinite(grad).all()),
                  rollout_data_keys=sorted(k for k in rollout_data if isinstance(rollout_data[k], list)),
                  teacher_dims=sorted({t.dim() for t in rollout_data.get("teacher_log_probs", [])}))
    if rank == 0:
        Path(result_path).write_text(json.dumps(result, default=str))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
