"""Where Slime puts the actor ranks and the rollout engines over the nodes of one Ray cluster, predicted and
checked before anything starts, and printed in the dry run.

Stage: engine (launch layout). Why: with several nodes nothing is decided by this project; Slime decides
(``slime/ray/placement_group.py``): one ``PACK`` placement group of ``actor + rollout`` one-GPU bundles, sorted
by (node IP address, GPU id); the first ``actor`` bundles are the actor's ranks in order (Megatron's TP groups
are consecutive ranks), the rest the rollout engines', ``TP`` consecutive GPUs each from the engine's first
bundle. Slime then assumes (``_allocate_rollout_engine_addr_and_ports_normal`` in ``slime/ray/rollout.py``) that
engine ``i`` is on the ``i // (GPUS_PER_NODE / TP)``-th node of the rollout GPUs and gives it that node's host
and ports. A layout breaks when a Megatron TP group or an SGLang engine spans two nodes, or when that
assumption does not hold; each is refused here, for every place the head node (which gives Ray fewer GPUs when
the judge runs on it) can take in the address order, since that order is only known when the nodes are up.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """``ray_gpus[k]``: the GPUs the k-th node in address order gives Ray; ``head``: which one is the head."""

    ray_gpus: tuple[int, ...]
    head: int
    gpus_per_node: int
    actor: int
    rollout: int
    train_tp: int
    rollout_tp: int

    def node_of(self) -> list[int]:
        """The node of each sorted bundle (Slime's order)."""
        return [k for k, n in enumerate(self.ray_gpus) for _ in range(n)]

    def problems(self) -> list[str]:
        nodes = self.node_of()
        out = []
        if len(nodes) != self.actor + self.rollout:
            return [f"Ray has {len(nodes)} GPUs but the actor and rollout need {self.actor + self.rollout}"]
        if self.train_tp:
            for first in range(0, self.actor, self.train_tp):
                group = set(nodes[first:first + self.train_tp])
                if len(group) > 1:
                    out.append(f"the Megatron TP group of actor ranks {first}-{first + self.train_tp - 1} would span "
                               f"nodes {sorted(group)} (TRAIN_TP={self.train_tp} across nodes)")
                    break
        per_node = max(1, self.gpus_per_node // self.rollout_tp)
        rollout_nodes = nodes[self.actor:]
        first_node: dict[int, int] = {}
        for i in range(self.rollout // self.rollout_tp):
            span = set(rollout_nodes[i * self.rollout_tp:(i + 1) * self.rollout_tp])
            if len(span) > 1:
                out.append(f"SGLang engine {i} (TP={self.rollout_tp}) would span nodes {sorted(span)} (TP across nodes)")
                break
            slime_node = first_node.setdefault(i // per_node, rollout_nodes[i * self.rollout_tp])
            if slime_node != rollout_nodes[i * self.rollout_tp]:
                out.append(f"SGLang engine {i} would be on node {rollout_nodes[i * self.rollout_tp]} but Slime gives it the "
                           f"host and ports of node {slime_node} (it assumes GPUS_PER_NODE / TP = {per_node} engines per "
                           "node from the first rollout GPU on)")
                break
        return out

    def lines(self) -> list[str]:
        nodes = self.node_of()
        out = []
        for k, n in enumerate(self.ray_gpus):
            ranks = [i for i in range(self.actor) if nodes[i] == k]
            engines = sorted({(i - self.actor) // self.rollout_tp for i in range(self.actor, len(nodes)) if nodes[i] == k})
            what = []
            if ranks:
                what.append(f"actor ranks {ranks[0]}-{ranks[-1]}")
            if engines:
                what.append(f"SGLang engine(s) {engines[0]}-{engines[-1]} (TP {self.rollout_tp})")
            role = " (head)" if k == self.head else ""
            out.append(f"#   node {k}{role}: {n} Ray GPU(s): {', '.join(what) or 'idle'}")
        return out


def layouts(num_nodes: int, gpus_per_node: int, head_ray_gpus: int, actor: int, rollout: int, train_tp: int,
            rollout_tp: int) -> list[Layout]:
    """One layout per place of the head in the address order (one, when every node gives Ray the same)."""
    places = range(num_nodes) if head_ray_gpus != gpus_per_node else range(1)
    return [Layout(tuple(head_ray_gpus if k == h else gpus_per_node for k in range(num_nodes)), h, gpus_per_node,
                   actor, rollout, train_tp, rollout_tp) for h in places]
