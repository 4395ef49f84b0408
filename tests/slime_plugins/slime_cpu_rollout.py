"""The rollout side of the driver: Slime's ``RolloutManager.generate`` calling our rollout function (rank 0).

Stage: launch script → Slime on CPU → **rollout** (proxy, scripted policy and judge) → Slime's train data.
Kept apart from the driver's trainer side (``slime_cpu_driver.main``): here the project's proxy is started
by our rollout function inside Slime's real ``generate``, against the project's scripted SGLang policy and
judge (``tests/support.py``), while ``chat_until_done`` chats sessions through it so turns get next states
and are judged; every sample Slime converted is then checked token for token against what the scripted
policy sampled (and, for OPD, what the hint-aware teacher scored). The ``RolloutManager`` is built without
its ``__init__`` (which starts SGLang engines, a router and a Ray ``Lock`` actor): its attributes are set
as ``__init__`` sets them with ``--debug-train-only``-style empty ``servers``.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import torch

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


def pytest_approx_list(values: list[float]) -> list:
    """Float lists compared at float32 precision (the teacher rides as float32)."""
    import math

    class Close(float):
        def __eq__(self, other):  # type: ignore[override]
            return math.isclose(float(self), float(other), rel_tol=1e-6, abs_tol=1e-6)

    return [Close(v) for v in values]
