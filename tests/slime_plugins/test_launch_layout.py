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
from openclaw_rl.launch.memory import (
    PPO_LOSS,
    TOPK_LOSS,
    TOPK_SELECT_LOSS,
    Estimate,
    attention_backend,
    choose,
    shape_from_args,
)
from openclaw_rl.launch.slime_args import QWEN3_4B, QWEN35_4B

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


def test_upstreams_long_sample_settings_fit_under_flash_attention_and_not_unfused():
    """Upstream: TP 4, CP 1, 32768 tokens per GPU at a 32768 context. The scripts pass --attention-backend flash
    (Megatron sets NVTE_UNFUSED_ATTN=0): no (S / CP)^2 scores, and upstream's sizes fit, so they are chosen.
    #52 ran out of memory in TransformerEngine's unfused softmax: an extra unfused backend counts the scores
    and needs context parallelism; a 1-GPU estimate still shows why more GPUs are needed."""
    upstream = Estimate(QWEN3, 4, 1, 80 * 10**9)
    assert upstream.total(32768, 32768) <= upstream.budget and upstream.scores(32768) == 0
    c = choose(QWEN3, actor_gpus=4, context=32768, gpu_gb=80, tp=None, cp=None, max_tokens=None, tp_default=4)
    assert (c.tp, c.cp, c.max_tokens_per_gpu) == (4, 1, 32768) and c.warning == ""
    assert "attention scores: none (--attention-backend flash)" in c.lines[-2] and ": fits;" in c.lines[-1]
    unfused = choose(QWEN3, actor_gpus=4, context=32768, gpu_gb=80, tp=None, cp=None, max_tokens=None, tp_default=4,
                     unfused_attention=True)
    assert Estimate(QWEN3, 4, 1, 80 * 10**9, unfused_attention=True).scores(32768) == 6 * 32 / 4 * 32768**2
    assert (unfused.tp, unfused.cp) == (2, 2) and "unfused attention scores: 6 B x 32 heads" in unfused.lines[-2]
    tight = choose(QWEN3, actor_gpus=1, context=32768, gpu_gb=80, tp=None, cp=None, max_tokens=None, tp_default=1)
    assert "may run out of memory" in tight.warning


def test_the_estimates_terms_are_the_ones_the_flags_give():
    """Each term by hand, from the module docstring (Qwen3-4B, TP 4, CP 1, 32768 tokens): bf16 weights + fp32
    grads; the checkpointed layer inputs; one recomputed layer, 2 B x (4h + 3q + 3kv + 2 heads + 3 ffn), twice
    (its gradients); logits 4 B + 8 B per kept log-softmax pass (not 24 B); no attention scores."""
    h, layers, vocab, q, kv, heads, ffn = 2560, 36, 151936, 32 * 128, 8 * 128, 32, 9728
    layer = 2 * 2 * (4 * h + 3 * q + 3 * kv + 2 * heads + 3 * ffn)
    assert QWEN3.layer_units == 54848 and layer == 219392
    e = Estimate(QWEN3, 4, 1, 80 * 10**9)
    assert e.per_token == (2 * h * layers + layer + 12 * vocab) / 4
    assert e.total(32768, 32768) == QWEN3.params * 6 / 4 + 6 * 1024**3 + 32768 * (2 * h * layers + layer + 12 * vocab) / 4
    two = Estimate(QWEN3, 4, 1, 80 * 10**9, loss=TOPK_SELECT_LOSS)  # its GRPO half and its top-K half
    assert two.per_token - e.per_token == 8 * vocab / 4
    # this project's PPO loss: one sample's response rows (up to 8192) x 4 B (temperature copy) and one chunk of
    # the detached entropy, min(rows, 1024) x 8 B (two fp32 temporaries; logprobs.ENTROPY_CHUNK_ROWS)
    ppo = Estimate(QWEN3, 4, 1, 80 * 10**9, loss=PPO_LOSS)
    assert ppo.per_sample(32768) == (4 * 8192 + 8 * 1024) * vocab / 4
    assert ppo.per_sample(4096) == (4 * 4096 + 8 * 1024) * vocab / 4
    assert ppo.per_sample(500) == (4 * 500 + 8 * 500) * vocab / 4
    assert Estimate(QWEN3, 4, 1, 80 * 10**9, loss=TOPK_SELECT_LOSS).per_sample(32768) == ppo.per_sample(32768)
    assert Estimate(QWEN3, 2, 2, 80 * 10**9, loss=TOPK_LOSS).per_sample(10000) == 4 * 5000 * vocab / 2
    assert e.per_sample(32768) == 0


def test_the_entropy_chunk_is_the_one_the_loss_uses():
    """The estimate's detached-entropy chunk is the loss's own constant (memory.py cannot import torch)."""
    from openclaw_rl.launch import memory
    from openclaw_rl.losses import logprobs

    assert memory.ENTROPY_CHUNK_ROWS == logprobs.ENTROPY_CHUNK_ROWS


def test_a_custom_spec_counts_its_layer_over_the_whole_sample():
    """Qwen3.5's --spec runs whole-sequence HF attention on every rank (gathered over TP and CP): its recomputed
    layer is counted for the whole sample, split by neither."""
    qwen35 = shape_from_args(QWEN35_4B)
    assert qwen35 is not None and qwen35.custom_spec and not QWEN3.custom_spec
    tp4, cp2 = Estimate(qwen35, 4, 1, 80 * 10**9), Estimate(qwen35, 2, 2, 80 * 10**9)
    assert tp4.per_sample(32768) == cp2.per_sample(32768) == 2 * 2 * qwen35.layer_units * 32768
    assert tp4.per_token == (2 * 2560 * 32 + 12 * 248320) / 4


def test_the_attention_backend_is_read_as_argparse_does():
    assert attention_backend(["--attention-backend", "flash", "--attention-backend", "unfused"]) == "unfused"
    assert attention_backend(["--attention-backend=local"]) == "local" and attention_backend(["--lr", "1"]) == ""


@pytest.mark.parametrize("argv", [["--attention-back", "unfused"], ["--attention-back=unfused"],
                                  ["--", "--attention-backend", "unfused"], ["--lr", "1", "--attention-backend"]])
def test_the_attention_backend_is_read_as_megatrons_parser_does(argv):
    """Megatron's parser, which reads Slime's flags, has ``allow_abbrev=False`` and ignores unknown flags
    (``parse_known_args``): an abbreviation is not the flag, nor is anything after ``--`` (a positional), so the
    scripts' flash stands and the plan counts no scores; a flag without its value (Slime refuses the launch)
    reads as none."""
    assert attention_backend(argv) == ""
    assert attention_backend(["--wandb-group", "x", "--attention-backend", "unfused", "--", "local"]) == "unfused"


def test_the_in_trainer_teacher_is_in_the_estimate():
    """OPENCLAW_COMBINE_OPD_TEACHER_SOURCE=trainer: every actor GPU also holds a whole bf16 teacher (not split by
    TP) and runs its forward of the longest sample before training (not split by CP: each CP rank scores the
    whole sequence), so the plan may need more CP ranks with it than without."""
    plain, with_teacher = (Estimate(QWEN3, 4, 1, 80 * 10**9, teacher) for teacher in (False, True))
    assert with_teacher.teacher_weights == QWEN3.params * 2 == Estimate(QWEN3, 1, 1, 80 * 10**9, True).teacher_weights
    # the teacher's forward (~17.6 GB) runs before the training pass (~13.7 GB of tokens here): the larger counts
    forward, training = with_teacher.teacher_forward(24576), plain.per_token * 24576
    assert 17e9 < forward < 18e9 and training < forward and plain.teacher_forward(24576) == 0
    assert with_teacher.total(24576, 24576) - plain.total(24576, 24576) == QWEN3.params * 2 + forward - training
    assert Estimate(QWEN3, 2, 2, 80 * 10**9, True).teacher_forward(24576) == forward
    assert with_teacher.longest() < plain.longest()
    kw = dict(actor_gpus=4, gpu_gb=80, tp=None, cp=None, max_tokens=None, tp_default=4)
    chosen = [choose(QWEN3, context=32768, teacher=teacher, **kw) for teacher in (False, True)]
    assert [(c.tp, c.cp) for c in chosen] == [(4, 1), (4, 1)] and chosen[1].warning == ""
    assert any(line.startswith("#   teacher  = ") for line in chosen[1].lines)
    one = dict(kw, actor_gpus=1, tp_default=1)  # TP 1: the whole policy and the whole teacher on one GPU
    assert choose(QWEN3, context=16384, **one).warning == ""
    assert "in-trainer teacher" in choose(QWEN3, context=16384, teacher=True, **one).warning


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
