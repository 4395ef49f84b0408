"""The launch plan's node layout (``openclaw_rl.launch.layout``), memory sizing (``openclaw_rl.launch.memory``)
and the Slime CPU checks' port range (``check_ports.py``): cheap unit tests. Slime's own placement code on a
simulated Ray cluster: test_multinode_cpu.py (heavy)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from check_ports import free_ports, port_range

from openclaw_rl.launch.layout import Layout, layouts
from openclaw_rl.launch.memory import Estimate, choose, shape_from_args
from openclaw_rl.launch.slime_args import QWEN3_4B

REPO_ROOT = Path(__file__).resolve().parents[2]
QWEN3 = shape_from_args(QWEN3_4B)


def test_upstreams_four_node_layout_puts_the_actor_on_two_whole_nodes():
    """Upstream's 4-node script says 4 actor GPUs per node; Slime's sorted placement fills nodes 0-1 with them."""
    (only,) = layouts(4, 8, 8, 16, 16, 4, 8)
    assert only.node_of()[:16] == [0] * 8 + [1] * 8 and only.problems() == []
    assert only.lines()[2] == "#   node 2: 8 Ray GPU(s): SGLang engine(s) 0-0 (TP 8)"


def test_a_tp_group_over_two_nodes_is_found_for_the_head_first():
    head_first, head_last = layouts(2, 8, 6, 8, 6, 4, 2)  # the judge takes 2 of the head's 8 GPUs
    assert "actor ranks 4-7 would span nodes [0, 1]" in head_first.problems()[0]
    assert head_last.problems() == []  # only known when the nodes are up: the plan refuses it


def test_slimes_engine_host_assumption_is_checked():
    """Slime gives engine i the host of the (i // (GPUS_PER_NODE / TP))-th rollout node."""
    (layout,) = layouts(2, 8, 8, 4, 12, 2, 2)
    assert "engine 2 would be on node 1 but Slime gives it the host and ports of node 0" in layout.problems()[0]
    assert Layout((8, 8), 0, 8, 8, 8, 2, 2).problems() == []


def test_upstreams_long_sample_settings_do_not_fit_and_the_chosen_ones_do():
    """Upstream: TP 4, CP 1, 32768 tokens per GPU at a 32768 context (#52: out of memory on 80 GB). Chosen for the
    default 4 actor GPUs: OpenClaw's 15-25K-token turns fit; a 1-GPU estimate shows why more GPUs are needed."""
    upstream = Estimate(QWEN3, 4, 1, 80 * 10**9)
    assert upstream.total(32768, 32768) > upstream.budget
    c = choose(QWEN3, actor_gpus=4, context=32768, gpu_gb=80, tp=None, cp=None, max_tokens=None, tp_default=4)
    assert (c.tp, c.cp) == (2, 2) and c.estimate is not None and c.estimate.longest() >= 25000
    assert c.max_tokens_per_gpu * c.cp >= 25000 and "longest sample that fits" in c.lines[-1]
    assert choose(QWEN3, actor_gpus=4, context=24576, gpu_gb=80, tp=None, cp=None, max_tokens=None,
                  tp_default=4).warning == ""
    tight = choose(QWEN3, actor_gpus=1, context=32768, gpu_gb=80, tp=None, cp=None, max_tokens=None, tp_default=1)
    assert "may run out of memory" in tight.warning


def test_the_in_trainer_teacher_is_in_the_estimate():
    """OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=trainer: every actor GPU also holds a whole bf16 teacher (not split by
    TP) and runs its forward of the longest sample before training (not split by CP: each CP rank scores the
    whole sequence), so the plan may need more CP ranks with it than without."""
    plain, with_teacher = (Estimate(QWEN3, 4, 1, 80 * 10**9, teacher) for teacher in (False, True))
    assert with_teacher.teacher_weights == QWEN3.params * 2 == Estimate(QWEN3, 1, 1, 80 * 10**9, True).teacher_weights
    # the teacher's forward (~17.6 GB) is smaller than the training pass here, so only its weights add up
    assert with_teacher.total(24576, 24576) - plain.total(24576, 24576) == QWEN3.params * 2
    assert 17e9 < with_teacher.teacher_forward(24576) < 18e9 and plain.teacher_forward(24576) == 0
    assert Estimate(QWEN3, 2, 2, 80 * 10**9, True).teacher_forward(24576) == with_teacher.teacher_forward(24576)
    assert with_teacher.longest() < 24576 < plain.longest()
    kw = dict(actor_gpus=4, gpu_gb=80, tp=None, cp=None, max_tokens=None, tp_default=4)
    assert choose(QWEN3, context=24576, **kw).warning == ""
    fits_not = choose(QWEN3, context=24576, teacher=True, **dict(kw, tp=4, cp=1))
    assert "in-trainer teacher" in fits_not.warning and any(line.startswith("#   teacher  = ") for line in fits_not.lines)
    chosen = [choose(QWEN3, context=24576, teacher=teacher, **kw) for teacher in (False, True)]
    assert [(c.tp, c.cp) for c in chosen] == [(4, 1), (2, 2)] and chosen[1].warning == ""
    assert choose(QWEN3, context=20480, teacher=True, **kw).warning == ""  # 20K-token samples fit beside it


def test_tp_is_chosen_to_divide_every_nodes_ray_gpus():
    c = choose(QWEN3, actor_gpus=8, context=32768, gpu_gb=80, tp=None, cp=None, max_tokens=None, tp_default=4,
               node_gpus=(6, 8))
    assert 6 % c.tp == 0 and 8 % (c.tp * c.cp) == 0


def test_secrets_never_reach_the_job_or_ray_argv(tmp_path):
    """The keys travel in the environment the script exports; the argv of the job, Ray and the judge never
    carry them (visible in ps and in Ray's job list)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SLIME_DIR": str(tmp_path), "HF_CKPT": str(tmp_path),
           "RUN_DIR": str(tmp_path / "run"), "USE_WANDB": "1", "SKIP_SLIME_FEATURE_CHECK": "1", "NUM_NODES": "2",
           "GPUS_PER_NODE": "8", "MASTER_ADDR": "10.0.0.1", "ACTOR_GPUS": "8", "ROLLOUT_GPUS": "6", "PRM_GPUS": "2",
           "PROXY_HOST": "0.0.0.0", "SGLANG_API_KEY": "k-proxy-1", "PRM_API_KEY": "k-judge-2",
           "TEACHER_API_KEY": "k-teacher-3", "WANDB_API_KEY": "k-wandb-4"}
    res = subprocess.run([sys.executable, "-m", "openclaw_rl.launch", "plan", "rl", "--dry-run", "--json"], env=env,
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    argv = " ".join(plan["OC_TRAIN_CMD"] + plan["OC_RAY_CMD"] + plan["OC_JUDGE_CMD"] + plan["OC_ENV"])
    assert "--use-wandb" in argv and not any(k in argv + res.stderr for k in ("k-proxy-1", "k-judge-2", "k-teacher-3",
                                                                              "k-wandb-4"))


def test_check_ports_come_from_the_range_and_skip_taken_ones():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        taken.listen()
        got = list(free_ports(range(port, port + 2)))
    assert port not in got and set(got) <= {port + 1}
    assert port_range({"OPENCLAW_CHECK_PORTS": "31000-31009"}) == range(31000, 31010)
    assert port_range({}) == range(29700, 29900)
    with pytest.raises(ValueError, match="OPENCLAW_CHECK_PORTS"):
        port_range({"OPENCLAW_CHECK_PORTS": "80-90"})
