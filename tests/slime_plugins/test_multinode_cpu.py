"""Several nodes on one CPU machine: the launch plan's own ``ray start`` commands make a Ray cluster of several
nodes (one ``ray start`` per node, each on its own loopback address 127.0.0.k, k >= 2, with its declared GPUs;
Ray replaces 127.0.0.1 itself by the machine's address), and Slime's own placement-group, actor-group and
engine-placement code places the plan's actor and rollout engines on it (``multinode_driver.py``). Checked: every actor rank and engine lands where the plan's layout says
(``openclaw_rl.launch.layout``), no Megatron TP group or SGLang engine spans two nodes, rank 0's address is the
master address, and each engine is given the host of the node it runs on. And, for a layout the plan refuses,
that Slime's code really gives an engine another node's host.

Heavy (a few Ray nodes, ~40 Ray worker processes, minutes): it runs with the Slime CPU check's variables,
``OPENCLAW_SLIME_DIR`` (THUDM/slime) and ``OPENCLAW_SLIME_PYTHON`` (a Python with Ray: the check's
``.cache/slime-cpu-venv``), and is skipped with the reason otherwise (Megatron is not needed)::

    OPENCLAW_SLIME_DIR=../slime OPENCLAW_SLIME_PYTHON=.cache/slime-cpu-venv/bin/python \
        .venv/bin/python -m pytest -n 0 tests/slime_plugins/test_multinode_cpu.py -rs
 What it does not do: run ``ray job submit`` (the minimal
``ray`` package has no dashboard; the driver connects with ``ray.init``), start SGLang or Megatron.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openclaw_rl.launch.layout import Layout
from openclaw_rl.servers import free_port

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
STUBS = HERE / "slime_cpu_stubs"
SLIME_DIR = os.environ.get("OPENCLAW_SLIME_DIR", "")
PYTHON = os.environ.get("OPENCLAW_SLIME_PYTHON", "")


def _skip_reason() -> str | None:
    if not (SLIME_DIR and PYTHON):
        return ("set OPENCLAW_SLIME_DIR (THUDM/slime) and OPENCLAW_SLIME_PYTHON (a Python with Ray, e.g. the CPU "
                "check's .cache/slime-cpu-venv): see this module's docstring")
    probe = subprocess.run([PYTHON, "-c", "import ray, slime.ray.placement_group, slime.ray.rollout"],
                           env={**os.environ, "PYTHONPATH": os.pathsep.join([str(STUBS), str(REPO_ROOT), SLIME_DIR])},
                           capture_output=True, text=True, timeout=300, check=False)
    return None if probe.returncode == 0 else f"Ray or Slime does not import: {probe.stderr.strip().splitlines()[-1:]}"


pytestmark = pytest.mark.skipif(bool(reason := _skip_reason()), reason=reason or "")


def _plan(tmp_path: Path, env: dict[str, str], rank: int) -> dict:
    full = {"PATH": f"{Path(PYTHON).parent}:{os.environ['PATH']}", "HOME": str(tmp_path), "SLIME_DIR": SLIME_DIR,
            "PYTHON": PYTHON, "RUN_DIR": str(tmp_path / "run"), "USE_WANDB": "0", "SKIP_SLIME_FEATURE_CHECK": "1",
            "HF_CKPT": str(tmp_path), "PRM_MODEL_PATH": str(tmp_path), "SINGLE_HOST_NODES": "1", **env,
            "NODE_RANK": str(rank)}
    res = subprocess.run([sys.executable, "-m", "openclaw_rl.launch", "plan", "rl", "--dry-run", "--json"], env=full,
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


class Cluster:
    """The plan's Ray commands, one process group per node (this test's own; stopped by their ids)."""

    def __init__(self, tmp_path: Path, env: dict[str, str], ips: list[str], gpus_per_node: int) -> None:
        self.tmp_path, self.groups = tmp_path, []
        self.head = _plan(tmp_path, env, 0)
        self.address = f"{env['MASTER_ADDR']}:{env['RAY_PORT']}"
        ray_env = {**os.environ, **dict(kv.split("=", 1) for kv in self.head["OC_ENV"]), "RAY_AUTH_MODE": "disabled",
                   "PATH": f"{Path(PYTHON).parent}:{os.environ['PATH']}"}
        # the simulated nodes share this machine's cores: each declares CPUs for its GPU bundles (Slime asks 1 each)
        extra = ["--num-cpus", str(gpus_per_node + 2)]
        self._start(self.head["OC_RAY_CMD"] + extra, {**ray_env, "CUDA_VISIBLE_DEVICES": self.head["OC_RAY_DEVICES"]}, "head")
        for k, ip in enumerate(ips, start=1):  # one at a time: each must register while the machine is loaded
            worker = _plan(tmp_path, {**env, "NODE_IP": ip}, k)
            self._start(worker["OC_RAY_CMD"] + extra, {**ray_env, "CUDA_VISIBLE_DEVICES": worker["OC_RAY_DEVICES"]},
                        f"worker{k}")

    def _start(self, cmd: list[str], env: dict[str, str], name: str) -> None:
        """Start one node and wait for its own "Ray runtime started." line. Ray gives a node 30 s to register
        with the head (a constant in ray/_private/node.py): on a loaded 2-core machine that can pass, and the
        node exits saying so; it is then started again, twice at most."""
        for attempt in range(3):
            path = self.tmp_path / f"{name}-{attempt}.log"
            with path.open("w") as log:
                proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self.groups.append(proc)
            deadline = time.monotonic() + 300
            while "Ray runtime started." not in path.read_text():
                if proc.poll() is not None:
                    break
                assert time.monotonic() < deadline, path.read_text()[-3000:]
                time.sleep(1)
            else:
                return
            assert "timed out during startup" in path.read_text(), path.read_text()[-3000:]
        raise AssertionError(f"{name} did not start in 3 attempts: {path.read_text()[-3000:]}")

    def place(self, plan: dict, num_nodes: int) -> dict:
        plan_path, result = self.tmp_path / "plan.json", self.tmp_path / "result.json"
        plan_path.write_text(json.dumps(plan))
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": os.pathsep.join([str(STUBS), str(REPO_ROOT), SLIME_DIR])}
        res = subprocess.run([PYTHON, str(HERE / "multinode_driver.py"), self.address, str(num_nodes), str(plan_path),
                              str(result)], env=env, capture_output=True, text=True, timeout=900, check=False)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
        return json.loads(result.read_text())

    def stop(self) -> None:
        for p in reversed(self.groups):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=30)
                    break
                except subprocess.TimeoutExpired:
                    continue


def _check(result: dict, layout: Layout) -> None:
    """Slime's placement is the plan's layout, and nothing spans nodes."""
    node = {ip: k for k, ip in enumerate(result["nodes"])}
    want = layout.node_of()
    actors = sorted(result["actors"], key=lambda a: a["rank"])
    assert [node[a["node_ip"]] for a in actors] == want[:layout.actor], actors
    assert all(a["master_addr"] == actors[0]["node_ip"] for a in actors[1:]), actors
    tp = result["train_tp"]
    for first in range(0, layout.actor, tp):
        assert len({a["node_ip"] for a in actors[first:first + tp]}) == 1, actors  # a Megatron TP group: one node
    engines = sorted(result["engines"], key=lambda e: e["rank"])
    firsts = want[layout.actor::layout.rollout_tp]
    assert [node[e["node_ip"]] for e in engines] == firsts, engines
    assert all(e["given"]["host"] == e["node_ip"] for e in engines), engines  # Slime's host is the engine's node
    assert all(int(e["base_gpu_id"]) + layout.rollout_tp <= result["gpus"][e["node_ip"]] for e in engines), engines


@pytest.fixture
def cluster(tmp_path_factory):
    made: list[Cluster] = []

    def make(env: dict[str, str], ips: list[str], gpus_per_node: int) -> Cluster:
        c = Cluster(tmp_path_factory.mktemp("nodes"), env, ips, gpus_per_node)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def _ports() -> dict[str, str]:
    return {"RAY_PORT": str(free_port()), "RAY_DASHBOARD_PORT": str(free_port()), "PORT": str(free_port()),
            "PRM_PORT": str(free_port())}


def test_two_nodes_judge_on_the_head_which_sorts_last(cluster):
    """2 x 4 GPUs, the judge on 2 of the head's (outside Ray); the head's address sorts after the worker's, so
    Slime puts the actor on the worker and the engine on the head."""
    env = {**_ports(), "NUM_NODES": "2", "GPUS_PER_NODE": "4", "MASTER_ADDR": "127.0.0.3", "ACTOR_GPUS": "4",
           "ROLLOUT_GPUS": "2", "PRM_GPUS": "2", "TP": "2", "PRM_TP": "2"}
    c = cluster(env, ["127.0.0.2"], 4)
    result = c.place(c.head, 2)
    _check(result, Layout((4, 2), 1, 4, 4, 2, result["train_tp"], 2))
    assert result["nodes"] == ["127.0.0.2", "127.0.0.3"] and result["gpus"] == {"127.0.0.2": 4, "127.0.0.3": 2}


def test_four_nodes_external_judge_and_a_layout_the_plan_refuses(cluster, tmp_path):
    """4 x 2 GPUs with PRM_URL: actor on nodes 0-1 (--actor-num-nodes 2), one engine on each of nodes 2-3. Then,
    on the same cluster, a layout the plan refuses (one actor GPU, seven TP-1 engines): Slime's own code gives
    engine 1, which runs on node 1, the host of node 0."""
    env = {**_ports(), "NUM_NODES": "4", "GPUS_PER_NODE": "2", "MASTER_ADDR": "127.0.0.2", "ACTOR_GPUS": "4",
           "ROLLOUT_GPUS": "4", "PRM_URL": "http://127.0.0.1:9", "PRM_MODEL_PATH": "", "TP": "2"}
    c = cluster(env, ["127.0.0.3", "127.0.0.4", "127.0.0.5"], 2)
    plan = c.head
    cmd = plan["OC_TRAIN_CMD"]
    assert cmd[cmd.index("--actor-num-nodes") + 1] == "2" and cmd[cmd.index("--actor-num-gpus-per-node") + 1] == "2"
    result = c.place(plan, 4)
    _check(result, Layout((2, 2, 2, 2), 0, 2, 4, 4, result["train_tp"], 2))

    refused = {**env, "ACTOR_GPUS": "1", "ROLLOUT_GPUS": "7", "TP": "1", "TRAIN_TP": "1"}
    res = subprocess.run([sys.executable, "-m", "openclaw_rl.launch", "plan", "rl", "--dry-run", "--json"],
                         env={**os.environ, **refused, "SINGLE_HOST_NODES": "1", "SKIP_SLIME_FEATURE_CHECK": "1",
                              "SLIME_DIR": SLIME_DIR, "HF_CKPT": str(tmp_path), "RUN_DIR": str(tmp_path / "r")},
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 2 and "gives it the host and ports of node 0" in res.stderr, res.stderr
    flags = {"--actor-num-nodes": "1", "--actor-num-gpus-per-node": "1", "--rollout-num-gpus": "7",
             "--rollout-num-gpus-per-engine": "1", "--tensor-model-parallel-size": "1"}
    bad = list(cmd)
    for flag, value in flags.items():
        bad[bad.index(flag) + 1] = value
    wrong = c.place({**plan, "OC_TRAIN_CMD": bad}, 4)
    engine1 = next(e for e in wrong["engines"] if e["rank"] == 1)
    assert engine1["node_ip"] == "127.0.0.3" and engine1["given"]["host"] == "127.0.0.2", wrong["engines"]
