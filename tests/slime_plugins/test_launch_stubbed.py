"""The launch scripts for real, against stub ray, python, curl and nvidia-smi: what starts, and that only
what the script started is stopped."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from launch_support import (
    Run,
)

# --- a real launch against stub tools: what starts, and that only that is stopped ------------------------

STUB_RAY = """#!/usr/bin/env bash
if [[ $1 == start ]]; then
  # written whole or not at all: the launch may stop this stub at any moment (a judge that dies at once)
  echo "$$ $CUDA_VISIBLE_DEVICES $*" > "$STUB_DIR/ray.start.$$" && mv "$STUB_DIR/ray.start.$$" "$STUB_DIR/ray.start"
  [[ -z ${STUB_RAY_START_RC:-} ]] || exit "${STUB_RAY_START_RC}"  # a worker's ray start that returns
  exec sleep 300
elif [[ $1 == job ]]; then
  printf '%s\\n' "$@" > "$STUB_DIR/submit.args"
  echo "${SGLANG_API_KEY:-}" > "$STUB_DIR/submit.key"
  exit "${STUB_JOB_RC:-0}"
fi
exit 1
"""
STUB_PYTHON = """#!/usr/bin/env bash
if [[ "$1 $2" == "-m openclaw_rl.slime_hooks.features" || "$1 $2" == "-m openclaw_rl.launch" ]]; then exec python3 "$@"; fi  # the real check
echo "$$ $CUDA_VISIBLE_DEVICES $*" > "$STUB_DIR/judge.start.$$" && mv "$STUB_DIR/judge.start.$$" "$STUB_DIR/judge.start"
[[ -z ${STUB_JUDGE_CRASH:-} ]] || { echo "CUDA out of memory"; exit 1; }
exec sleep 300
"""
STUB_CURL = """#!/usr/bin/env bash
if [[ -n ${STUB_JUDGE_CRASH:-} && "$*" == *"/health"* && "$*" != *"/api/version"* ]]; then exit 7; fi
# a server this launch started answers once its stub runs, as the real one does: the launch cannot outrun it
if [[ "$*" == *"127.0.0.1:"*"/api/version"* ]]; then [[ -e "$STUB_DIR/ray.start" ]] || exit 7; fi
if [[ "$*" == *"127.0.0.1:"*"/health"* ]]; then [[ -e "$STUB_DIR/judge.start" ]] || exit 7; fi
exit 0
"""
STUB_NVIDIA_SMI = """#!/usr/bin/env bash
for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: Fake H200 (UUID: GPU-$i)"; done
"""


def free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def stubbed(launch, tmp_path):
    if shutil.which("setsid") is None:
        pytest.skip("setsid (util-linux) not installed")
    stub_dir = tmp_path / "stubs"
    stub_dir.mkdir()
    for name, body in {"ray": STUB_RAY, "curl": STUB_CURL, "nvidia-smi": STUB_NVIDIA_SMI,
                       "fake-python": STUB_PYTHON}.items():
        (stub_dir / name).write_text(body)
        (stub_dir / name).chmod(0o755)
    ray_port, dash_port, proxy_port, judge_port = free_ports(4)

    def run(variant: str, **env: str) -> Run:
        base = {"DRY_RUN": "0", "PATH": f"{stub_dir}:{os.environ['PATH']}", "STUB_DIR": str(stub_dir),
                "PYTHON": str(stub_dir / "fake-python"), "RAY_PORT": str(ray_port),
                "RAY_DASHBOARD_PORT": str(dash_port), "PORT": str(proxy_port), "PRM_PORT": str(judge_port),
                "RAY_TEMP_DIR": str(tmp_path / "ray")}
        base.update(env)
        return launch(variant, **base)

    run.stub_dir = stub_dir  # type: ignore[attr-defined]
    return run


def test_real_launch_starts_judge_ray_and_job_then_stops_only_those(stubbed):
    bystander = subprocess.Popen(["sleep", "60"])  # a process this script did not start
    try:
        run = stubbed("rl", SGLANG_API_KEY="k3y")
        assert run.rc == 0, run.err
        stubs = stubbed.stub_dir
        judge_pid, judge_gpus, *judge_cmd = (stubs / "judge.start").read_text().split()
        ray_pid, ray_gpus, *ray_cmd = (stubs / "ray.start").read_text().split()
        assert (judge_gpus, ray_gpus) == ("6,7", "0,1,2,3,4,5")
        assert judge_cmd[:2] == ["-m", "sglang.launch_server"] and ray_cmd[:3] == ["start", "--head", "--block"]
        submitted = (stubs / "submit.args").read_text().split("\n")
        assert submitted[:2] == ["job", "submit"] and "--custom-config-path" in submitted
        assert (stubs / "submit.key").read_text().strip() == "k3y"  # inherited, never on a command line
        assert "k3y" not in "".join(submitted)
        assert not alive(int(judge_pid)) and not alive(int(ray_pid)), "started processes must be stopped"
        assert alive(bystander.pid), "a process the script did not start was killed"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_judge_that_dies_at_startup_is_reported_and_ray_is_stopped(stubbed):
    run = stubbed("opd", STUB_JUDGE_CRASH="1", JUDGE_STARTUP_TIMEOUT="60")
    assert run.rc == 2
    assert "judge server exited before it became ready" in run.err and "CUDA out of memory" in run.err
    started = stubbed.stub_dir / "ray.start"
    # the judge can die before the Ray stub has run at all: the launch stopped both groups it started, Ray's
    # and the judge's, and a Ray stub that got to write its pid is not alive
    assert run.err.count("stopping process group") == 2, run.err
    if started.exists():
        assert not alive(int(started.read_text().split()[0]))
    assert not (stubbed.stub_dir / "submit.args").exists(), "training must not start without a judge"


def test_a_worker_node_only_joins_the_heads_ray_cluster(stubbed):
    """NODE_RANK=1 of the two-node script: `ray start --address` with all its GPUs; no judge, no job."""
    run = stubbed("topk_select_2nodes", NODE_RANK="1", MASTER_ADDR="10.0.0.1", STUB_RAY_START_RC="0")
    assert run.rc == 0, run.err
    stubs = stubbed.stub_dir
    _, gpus, *ray_cmd = (stubs / "ray.start").read_text().split()
    assert gpus == "0,1,2,3,4,5,6,7" and ray_cmd[:4] == ["start", "--block", "--address", ray_cmd[3]]
    assert ray_cmd[3].startswith("10.0.0.1:") and ray_cmd[ray_cmd.index("--num-gpus") + 1] == "8"
    assert not (stubs / "judge.start").exists() and not (stubs / "submit.args").exists()


def test_an_existing_ray_cluster_is_joined_not_started(stubbed):
    """RAY_ADDRESS: nothing is started here (no Ray head, no judge: PRM_URL); the job goes to that cluster's
    dashboard, the key stays in the environment."""
    run = stubbed("rl", RAY_ADDRESS="http://10.0.0.1:8265", PRM_URL="http://judge:1", NUM_NODES="2",
                  GPUS_PER_NODE="8", ACTOR_GPUS="8", ROLLOUT_GPUS="8", SGLANG_API_KEY="k3y")
    assert run.rc == 0, run.err
    stubs = stubbed.stub_dir
    assert not (stubs / "ray.start").exists() and not (stubs / "judge.start").exists()
    submitted = (stubs / "submit.args").read_text().split("\n")
    assert submitted[submitted.index("--address") + 1] == "http://10.0.0.1:8265" and "k3y" not in "".join(submitted)
    assert "waiting for Ray cluster at http://10.0.0.1:8265/api/version" in run.err


def test_a_failed_job_returns_its_status(stubbed):
    run = stubbed("rl", STUB_JOB_RC="3")
    assert run.rc == 3 and "ended with status 3" in run.err
