"""Place a launch plan's actor and rollout engines with Slime's own code on a running (simulated) Ray cluster
(run by test_multinode_cpu.py in the Slime check's Python).

    python multinode_driver.py RAY_ADDRESS NUM_NODES PLAN_JSON RESULT_JSON

``PLAN_JSON`` is ``python -m openclaw_rl.launch plan ... --json``'s output; its ``ray job submit`` command line
gives the cluster flags (``--actor-num-nodes``, ``--actor-num-gpus-per-node``, ``--rollout-num-gpus``,
``--rollout-num-gpus-per-engine``, ``--num-gpus-per-node``) and the job's PYTHONPATH. Then, unchanged Slime
code (THUDM/slime): ``create_placement_groups`` (its PACK placement group, InfoActors, sort by node address),
``RayTrainGroup._allocate_gpus_for_actor`` (one Ray actor per rank on the reordered bundles; rank 0's address is
the master address) and ``ServerGroup.start_engines`` with ``_allocate_rollout_engine_addr_and_ports_normal``
(one actor per SGLang engine on its first bundle; each engine is given a host and ports). Stand-ins: the
training actor class (Slime's ``actor_cls`` parameter) and the SGLang engine class are probes that report the
node and GPU Ray gave them, and what Slime told them; ``args`` holds only what this code reads (Slime's full
``parse_args`` runs in test_slime_cpu.py).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

import ray


class ProbeActor:
    """In place of MegatronTrainRayActor: what Ray and Slime gave this rank."""

    def __init__(self, world_size, rank, master_addr, master_port):
        self.info = {"rank": rank, "world_size": world_size, "master_addr": master_addr}

    def get_master_addr_and_port(self):
        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def where(self):
        return {**self.info, "node_ip": ray.util.get_node_ip_address(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


class ProbeEngine:
    """In place of SGLangEngine: the node it runs on, its first GPU, and the host Slime gave it."""

    def __init__(self, args, rank, worker_type="regular", base_gpu_id=None, sglang_overrides=None,
                 num_gpus_per_engine=None):
        self.info = {"rank": rank, "base_gpu_id": base_gpu_id, "num_gpus_per_engine": num_gpus_per_engine}

    def _get_current_node_ip_and_free_port(self, start_port=15000, consecutive=1):
        return ray.util.get_node_ip_address(), start_port

    def init(self, **kwargs):
        self.info["given"] = {k: v for k, v in kwargs.items() if k in ("host", "port", "dist_init_addr")}

    def where(self):
        return {**self.info, "node_ip": ray.util.get_node_ip_address(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}


def cluster_args(plan: dict) -> tuple[argparse.Namespace, dict]:
    cmd = plan["OC_TRAIN_CMD"]
    runtime_env = json.loads(cmd[cmd.index("--runtime-env-json") + 1])
    flags = cmd[cmd.index("--") + 3:]
    value = {f: flags[flags.index(f) + 1] for f in ("--actor-num-nodes", "--actor-num-gpus-per-node",
                                                    "--rollout-num-gpus", "--rollout-num-gpus-per-engine",
                                                    "--num-gpus-per-node", "--tensor-model-parallel-size")}
    args = argparse.Namespace(
        actor_num_nodes=int(value["--actor-num-nodes"]), actor_num_gpus_per_node=int(value["--actor-num-gpus-per-node"]),
        rollout_num_gpus=int(value["--rollout-num-gpus"]),
        rollout_num_gpus_per_engine=int(value["--rollout-num-gpus-per-engine"]),
        num_gpus_per_node=int(value["--num-gpus-per-node"]), tensor_model_parallel_size=int(value["--tensor-model-parallel-size"]),
        colocate=False, debug_train_only=False, debug_rollout_only=False, rollout_external=False, use_critic=False,
        train_env_vars={}, offload_train=False, train_backend="megatron", use_routing_replay=False,
        rollout_data_transport="object-store", sglang_dp_size=1, sglang_pp_size=1, seed=1234, hf_checkpoint="",
        update_weight_start_version=0)
    return args, runtime_env


def main() -> None:
    address, num_nodes, plan_path, result_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    args, runtime_env = cluster_args(json.loads(Path(plan_path).read_text()))
    ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    deadline = time.monotonic() + 300
    while sum(n["Alive"] for n in ray.nodes()) < num_nodes:  # the workers join after the head
        if time.monotonic() > deadline:
            raise SystemExit(f"only {sum(n['Alive'] for n in ray.nodes())} of {num_nodes} Ray nodes joined")
        time.sleep(1)

    import slime.ray.rollout as rollout
    from slime.ray.actor_group import RayTrainGroup
    from slime.ray.placement_group import create_placement_groups

    pgs = create_placement_groups(args)
    group = RayTrainGroup(args, args.actor_num_nodes, args.actor_num_gpus_per_node, pgs["actor"], num_gpus_per_actor=0.4,
                          actor_cls=ProbeActor)
    group._allocate_gpus_for_actor(pgs["actor"], 0.4)
    actors = ray.get([a.where.remote() for a in group._actor_handlers])

    rollout.SGLangEngine = ProbeEngine  # start_engines wraps this module global with ray.remote
    tp = args.rollout_num_gpus_per_engine
    server = rollout.ServerGroup(args=args, pg=pgs["rollout"], all_engines=[None] * (args.rollout_num_gpus // tp),
                                 num_gpus_per_engine=tp, num_new_engines=0, router_ip="127.0.0.1", router_port=1)
    handles, _ = server.start_engines()
    ray.get(handles)
    engines = ray.get([e.where.remote() for e in server.all_engines])
    nodes = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}, key=lambda ip: tuple(map(int, ip.split("."))))
    with open(result_path, "w") as f:
        json.dump({"actors": actors, "engines": engines, "nodes": nodes, "train_tp": args.tensor_model_parallel_size,
                   "gpus": {n["NodeManagerAddress"]: n["Resources"].get("GPU", 0) for n in ray.nodes() if n["Alive"]}}, f)


if __name__ == "__main__":
    main()
