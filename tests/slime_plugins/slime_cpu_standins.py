"""The driver's stand-ins for a GPU and a Megatron model (``slime_cpu_driver.py``, one process per rank).

Stage: launch script → Slime on CPU → **stand-ins** → Slime's trainer. Kept apart from the driver because
they replace what this machine lacks, not what the check checks: a fixed table ``E[token] -> logits`` in
place of the Megatron model (each TP rank holds its vocab columns, like Megatron's vocab-parallel output
layer), and Slime's device calls answered for the CPU (a CPU backend for its accelerator API, or, for the
bundled Slime that predates that API, the few ``torch.cuda`` calls on the driven paths).
"""

from __future__ import annotations

import torch

VOCAB_SEED = 1234
TEACHER_SEED = 4321  # the table standing in for THUDM/slime's --opd-teacher-load checkpoint


class TableModel:
    """``logits[t] = E[token_t, shard]``: deterministic in the tokens, one leaf parameter per rank."""

    def __init__(self, vocab: int, tp: int, rank: int, seed: int = VOCAB_SEED) -> None:
        # The same padded width at every TP (Megatron pads the vocabulary too), so TP=1 and TP=2 see one table.
        full = torch.randn(vocab, vocab + (-vocab) % 8, generator=torch.Generator().manual_seed(seed))
        width = full.size(1) // tp
        self.weight = full[:, rank * width : (rank + 1) * width].clone().requires_grad_()

    def __call__(self, tokens_1T: torch.Tensor) -> torch.Tensor:
        return self.weight[tokens_1T]  # [1, T, V_local]


def cpu_device() -> None:
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
