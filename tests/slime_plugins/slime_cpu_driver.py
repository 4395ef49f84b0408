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
"""

from __future__ import annotations

import inspect
import json
import os
import shlex
import sys
import threading
import types
from pathlib import Path

import torch
import torch.distributed as dist

VOCAB_SEED = 1234
TEACHER_SEED = 4321  # the table standing in for THUDM/slime's --opd-teacher-load checkpoint


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


class TableModel:
    """``logits[t] = E[token_t, shard]``: deterministic in the tokens, one leaf parameter per rank."""

    def __init__(self, vocab: int, tp: int, rank: int, seed: int = VOCAB_SEED) -> None:
        # The same padded width at every TP (Megatron pads the vocabulary too), so TP=1 and TP=2 see one table.
        full = torch.randn(vocab, vocab + (-vocab) % 8, generator=torch.Generator().manual_seed(seed))
        width = full.size(1) // tp
        self.weight = full[:, rank * width : (rank + 1) * width].clone().requires_grad_()

    def __call__(self, tokens_1T: torch.Tensor) -> torch.Tensor:
        return self.weight[tokens_1T]  # [1, T, V_local]


def _cpu_device() -> None:
    """Run Slime's device calls on the CPU.

    Current Slime goes through its accelerator API (``slime.utils.accelerator``), which registers CUDA and
    MUSA only: it gets a CPU backend through its own ``set_accelerator``. The Slime bundled in OpenClaw-RL
    predates that API and calls ``torch.cuda`` directly: the few calls on the paths driven here
    (``current_device`` as a ``.to`` target, ``Tensor.cuda``, ``synchronize``, ``empty_cache``) answer for the CPU.
    """
    try:
        from slime.utils import accelerator
    except ImportError:
        torch.cuda.current_device = lambda: torch.device("cpu")
        torch.cuda.synchronize = torch.cuda.empty_cache = lambda *a, **k: None
        torch.Tensor.cuda = lambda self, *a, **k: self
        return
    accelerator.set_accelerator(_cpu_accelerator())


def _cpu_accelerator():
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


FOLLOW_UPS = {  # the user's next message per session (cycled): the next state the judge scores
    # rl: 3 of 4 positive, so the (unnormalised) rewards do not cancel and the loss has a real gradient
    "rl": ("thanks, that helps", "thanks, that helps", "that is wrong", "thanks, that helps"),
    "opd": ("that is wrong, answer in french", "wrong again, in french please"),
    "opd_topk": ("that is wrong, answer in french", "wrong again, in french please"),
    "combine": ("thanks, that helps", "that is wrong, answer in french"),
    "topk_select": ("thanks, that helps", "that is wrong, answer in french"),
    # OEL: each session ends after its second turn (X-Session-Done); the judge then extracts the experience
    "qwen3_1.7b_oel_online": ("that is wrong, answer in french", "wrong again, in french please"),
}
# The mode whose proxy a launch variant's rollout hook starts (its key in the bridge's runtimes).
RUNTIME_MODE = {"opd_topk": "opd", "topk_select": "combine", "qwen3_1.7b_oel_online": "oel"}


def oel_aware_judge(judge_reply):
    """The scripted judge, plus OEL's experience extraction: the hint as the one rule when the conversation
    has a correction (so the hint-aware teacher scorer shows the teacher saw the experience)."""
    from support import HINT

    def reply(prompt: str) -> str:
        if "[EXPERIENCE_START]" not in prompt:
            return judge_reply(prompt)
        if "wrong" in prompt.split("## Conversation", 1)[-1]:
            return f"Learned. [EXPERIENCE_START]\n- {HINT}\n[EXPERIENCE_END] \\boxed{{1}}"
        return "Nothing. \\boxed{0}"

    return reply
MAX_SESSIONS = 24  # bounded: the batch needs ROLLOUT_BATCH_SIZE judged turns


def chat_until_done(url: str, mode: str, done: threading.Event) -> list[str]:
    """Chat sessions through the proxy until Slime's rollout returns; returns each session's follow-up."""
    import httpx

    follow_ups: list[str] = []
    with httpx.Client(timeout=60, trust_env=False) as client:
        for i in range(MAX_SESSIONS):
            if done.is_set():
                break
            convo = [{"role": "user", "content": f"question {i}: hello there"}]
            follow_ups.append(FOLLOW_UPS[mode][i % len(FOLLOW_UPS[mode])])
            for next_user in (follow_ups[-1], "ok"):
                headers = {"X-Session-Id": f"session-{i}"}
                if RUNTIME_MODE.get(mode) == "oel" and next_user == "ok":  # OEL distils a session once it ends
                    headers["X-Session-Done"] = "1"
                r = client.post(f"{url}/v1/chat/completions", json={"messages": convo}, headers=headers)
                if r.status_code == 503:  # the gate closed behind a full batch (it was open when we began)
                    return follow_ups
                r.raise_for_status()
                convo += [r.json()["choices"][0]["message"], {"role": "user", "content": next_user}]
    return follow_ups


def rollout_through_slime(args, mode: str, slime_rollout, load_function):
    """Slime's ``RolloutManager.generate(0)`` with our rollout function, against the scripted engines."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: support.py's scripted engines
    from support import hint_aware_scorer, judge_reply, policy_reply, scripted_server
    from transformers import AutoTokenizer

    from openclaw_rl.engine.scripted import hash_scorer
    from openclaw_rl.slime_hooks.bridge import shutdown_runtimes

    tok = AutoTokenizer.from_pretrained(args.hf_checkpoint)
    report: dict = {}
    # The judge listens where the launch script's run config (Slime's --custom-config-path, set on args by
    # Slime's parse_args) says the PRM server is.
    judge_port = int(args.openclaw_judge_url.rsplit(":", 1)[1])
    policy_port = int(os.environ.get("OPENCLAW_CHECK_POLICY_PORT") or 0) or None  # test_slime_cpu.py's range
    with scripted_server(tok, policy_reply, port=policy_port) as policy, \
            scripted_server(tok, oel_aware_judge(judge_reply), port=judge_port, scorer=hint_aware_scorer(tok)):
        # Slime sets these once its SGLang router is up; the router here is the scripted policy engine.
        args.sglang_router_ip, port = policy.url.removeprefix("http://").rsplit(":", 1)
        args.sglang_router_port = int(port)

        manager_cls = getattr(slime_rollout.RolloutManager, "__ray_actor_class__", slime_rollout.RolloutManager)
        manager = object.__new__(manager_cls)  # __init__ would start SGLang engines and Ray actors
        manager.args, manager.servers, manager._health_monitors, manager.rollout_id = args, {}, [], -1
        # what the bundled Slime's __init__ sets instead (one health monitor, no engines, no CI checker)
        manager._health_monitor, manager._metric_checker = None, None
        manager.all_rollout_engines, manager.nodes_per_engine = [], 1
        manager.data_source = load_function(args.data_source_path)(args)
        real_rollout = load_function(args.rollout_function_path)
        returned: list = []

        def rollout_spy(*a, **k):  # what our function handed to Slime, to check it after Slime's conversion
            returned.append(real_rollout(*a, **k))
            if os.environ.get(STUDENT_IDS_ENV):
                add_student_ids(args, [s for group in returned[-1].samples for s in group])
            return returned[-1]

        manager.generate_rollout = rollout_spy
        manager.eval_generate_rollout = load_function(args.eval_function_path)
        manager.custom_reward_post_process_func = (load_function(args.custom_reward_post_process_path)
                                                   if args.custom_reward_post_process_path else None)
        manager.custom_convert_samples_to_train_data_func = (
            load_function(args.custom_convert_samples_to_train_data_path)
            if args.custom_convert_samples_to_train_data_path else None)
        manager.train_parallel_config = {"dp_size": 1, "cp_size": 1, "vpp_size": 1,
                                         "microbatch_group_size_per_vp_stage": 1}
        out: dict = {}
        done = threading.Event()

        def generate() -> None:
            try:
                out["refs"] = manager.generate(0)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
                out["error"] = exc
            finally:
                done.set()

        worker = threading.Thread(target=generate, daemon=True)
        worker.start()
        from openclaw_rl.slime_hooks.bridge import _RUNTIMES

        runtime_mode = RUNTIME_MODE.get(mode, mode)
        for _ in range(1200):  # the proxy starts inside our rollout function, called by Slime
            if done.is_set() or (runtime_mode in _RUNTIMES and _RUNTIMES[runtime_mode].proxy.gate.is_open):
                break
            done.wait(0.1)
        follow_ups = [] if done.is_set() else chat_until_done(_RUNTIMES[runtime_mode].url, mode, done)
        done.wait(120)
        if "error" in out:
            raise out["error"]
        if "refs" not in out:
            proxy = _RUNTIMES[runtime_mode].proxy
            raise AssertionError(f"Slime's generate did not return: {proxy.spool.ready_count()} samples ready "
                                 f"after {len(follow_ups)} sessions, {proxy.tracker.pending_turns} turns pending")
        shutdown_runtimes()

        samples = [s for group in returned[0].samples for s in group]
        eos = min(policy.model.eos_token_ids)
        checks = []
        for s in samples:
            prompt, response = s.tokens[: -s.response_length], s.tokens[-s.response_length :]
            script = policy.model.encode_non_canonical(policy_reply(tok.decode(prompt, skip_special_tokens=False)))
            lps = [hash_scorer(prompt + response[:j], t) for j, t in enumerate(response)]
            session = int(s.metadata["session_id"].rsplit("-", 1)[1])
            teacher = getattr(s, "teacher_log_probs", None)  # an attribute, not a field, in the bundled Slime
            if teacher is not None:
                teacher = (teacher[:, 0] if teacher.dim() == 2 else teacher).tolist()
            checks.append({
                "session": session, "turn": s.metadata["turn"], "follow_up": follow_ups[session],
                "tokens_exact": response in (script, script + [eos]),
                "log_probs_exact": s.rollout_log_probs == pytest_approx_list(lps),
                "reward": s.get_reward_value(args),
                "teacher_is_hinted": teacher is not None and teacher == pytest_approx_list(
                    [-((t % 7) + 1) / 10 for t in response]),
                "teacher_is_rollout": teacher is not None and teacher == pytest_approx_list(s.rollout_log_probs),
                "has_topk": hasattr(s, "teacher_topk_indices"),
            })
        report.update(n_samples=len(samples), sessions=len(follow_ups), checks=checks,
                      policy_requests=len(follow_ups), metrics=returned[0].metrics)
    return out["refs"], report


def megatron_teacher_report(rollout_data: dict, sample_teacher: list, teacher_table: torch.Tensor) -> dict:
    """What the loss got as teacher log-probs under --use-opd --opd-type megatron, against (a) the teacher table
    scoring each Sample's own tokens and (b) the hinted teacher log-probs the Sample carried."""
    def max_diff(a: list, b: list) -> float:
        return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))

    own = []
    for tokens, r in zip(rollout_data["tokens"], rollout_data["response_lengths"], strict=True):
        tokens = torch.as_tensor(tokens)
        logp = torch.log_softmax(teacher_table[tokens[:-1]].float(), dim=-1)[-r:]
        own.append(logp.gather(-1, tokens[-r:].unsqueeze(-1)).squeeze(-1))
    slime = rollout_data["teacher_log_probs"]
    return {"vs_own_tokens": max_diff(slime, own), "vs_sample": max_diff(slime, sample_teacher),
            "sample_vs_own_tokens": max_diff(sample_teacher, own), "n": len(slime)}


STUDENT_IDS_ENV = "OPENCLAW_CHECK_STUDENT_IDS"  # test_slime_cpu.py: distill_subset student through Slime's actor


@torch.no_grad()
def add_student_ids(args, samples: list) -> None:
    """distill_subset student: pack beside each hinted prompt the policy's own top-K ids at each response position.
    The scripted engine has no model, so they come from the HF checkpoint on the Sample's own tokens (the
    rollout engine's top-K stand-in; the proxy's recording of SGLang's top-K is not built)."""
    from transformers import AutoModelForCausalLM

    from openclaw_rl.slime_hooks.trainer_teacher import (
        is_packed_prompt,
        pack_teacher_prompt,
        unpack_teacher_prompt,
    )

    model = AutoModelForCausalLM.from_pretrained(args.hf_checkpoint, dtype=torch.float32).eval()
    for s in samples:
        if not is_packed_prompt(getattr(s, "teacher_log_probs", None)):
            continue
        prompt, k = unpack_teacher_prompt(s.teacher_log_probs)
        r, t = s.response_length, len(s.tokens)
        logits = model(input_ids=torch.tensor([s.tokens])).logits[0, t - r - 1 : t - 1].float()
        ids = torch.log_softmax(logits / float(args.rollout_temperature), dim=-1).topk(k, dim=-1).indices
        s.teacher_log_probs = pack_teacher_prompt(prompt, r, k, ids.tolist())


@torch.no_grad()
def trainer_teacher_report(args, rollout_data: dict, sample_teacher: list, loss_teacher: dict) -> dict:
    """teacher_source trainer: the teacher log-probs the loss read against a plain full forward of the frozen
    HF teacher (the policy's checkpoint) on the packed prompt (prompt + hint) + the sampled response."""
    from transformers import AutoModelForCausalLM

    from openclaw_rl.slime_hooks.trainer_teacher import (
        is_packed_prompt,
        unpack_teacher_prompt_and_student_ids,
    )

    model = AutoModelForCausalLM.from_pretrained(args.hf_checkpoint, dtype=torch.float32).eval()
    temperature = float(args.rollout_temperature)
    diffs, top_diffs, ids_equal, hinted, own, at_student, not_own_topk = [], [], True, 0, 0, 0, 0
    for tokens, r, carried in zip(rollout_data["tokens"], rollout_data["response_lengths"], sample_teacher, strict=True):
        tokens = [int(t) for t in torch.as_tensor(tokens).tolist()]
        if not is_packed_prompt(carried):
            own += 1
            continue
        prompt, k, student = unpack_teacher_prompt_and_student_ids(carried)
        hinted += prompt != tokens[: len(tokens) - r]  # the hinted prompt, not the sample's own
        ids = torch.tensor([prompt + tokens[len(tokens) - r:]])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + r].float()
                                 / temperature, dim=-1)
        want = logp.gather(-1, ids[0, len(prompt):].unsqueeze(-1)).squeeze(-1)
        got, top_lp, top_ids = loss_teacher[tuple(tokens)]
        values, ids = logp.topk(max(k, 1), dim=-1)
        if student is not None:  # distill_subset student: the teacher read at the student's ids, not its own top-K
            at_student += 1
            not_own_topk += int(not torch.equal(student, ids))
            values, ids = logp.gather(-1, student), student
        if got.numel() != r:  # context parallelism: this rank's rows, by Slime's own slice of the student's
            from slime.backends.megatron_utils.cp_utils import slice_log_prob_with_cp

            want, values, ids = (slice_log_prob_with_cp(x, len(tokens), r) for x in (want, values, ids))
        diffs.append(float((got.float() - want).abs().max()))
        if k:
            top_diffs.append(float((top_lp.float() - values).abs().max()))
            ids_equal = ids_equal and bool(torch.equal(top_ids.long(), ids))
    return {"n_scored": len(diffs), "n_hinted_prompt": hinted, "n_own_teacher": own,
            "max_abs_diff": max(diffs) if diffs else None,
            "topk_max_abs_diff": max(top_diffs) if top_diffs else None, "topk_ids_equal": ids_equal,
            "n_at_student_ids": at_student, "n_student_ids_not_teacher_topk": not_own_topk}


def pytest_approx_list(values: list[float]) -> list:
    """Float lists compared at float32 precision (the teacher rides as float32)."""
    import math

    class Close(float):
        def __eq__(self, other):  # type: ignore[override]
            return math.isclose(float(self), float(other), rel_tol=1e-6, abs_tol=1e-6)

    return [Close(v) for v in values]


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
    _cpu_device()

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
