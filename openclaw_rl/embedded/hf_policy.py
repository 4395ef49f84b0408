"""Load the policy the embedded trainer updates: any Hugging Face causal LM, e.g. Qwen3 0.6B–8B.

Stage: checkpoint → **trainer model**. The tiny CPU model and a real Qwen3 checkpoint load the same way;
what differs is precision and memory: fp32 on CPU (the engine and the trainer then agree to ~1e-6);
on a GPU, bf16 for a LoRA run (the frozen base in bf16, as SGLang serves it; peft keeps the adapters in
fp32) and fp32 for full-parameter training, because this trainer keeps no separate fp32 master copy and
pure-bf16 AdamW rounds away updates of 1e-6-scale learning rates (a weight of 0.02 has a bf16 step of
1e-4); gradient checkpointing for long OpenClaw prompts; LoRA through ``peft`` as an option. With LoRA only the adapters train; ``weight_sync.full_state_dict``
merges them into full weights for the server, so the server needs no LoRA support.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used: the CLI imports this module to register `train`
    import torch

log = logging.getLogger(__name__)

# Qwen2/Qwen3 (and Llama-style) projection names: attention and MLP.
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class PolicyLoadConfig:
    device: str = "auto"  # auto = cuda when available, else cpu
    dtype: str = "auto"  # auto = float32, except bfloat16 for LoRA on cuda (see the module docstring)
    gradient_checkpointing: bool = False
    lora_rank: int = 0  # > 0 trains LoRA adapters of this rank instead of all weights
    lora_alpha: float = 0.0  # 0 = 2 × rank
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = field(default=DEFAULT_LORA_TARGETS)

    def resolved_device(self) -> torch.device:
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolved_dtype(self) -> torch.dtype:
        import torch

        name = self.dtype
        if name == "auto":
            name = "bfloat16" if self.resolved_device().type == "cuda" and self.lora_rank > 0 else "float32"
        dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        if name not in dtypes:
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, not {name!r}")
        return dtypes[name]


def load_policy(model_path: str, cfg: PolicyLoadConfig) -> torch.nn.Module:
    """The trainable model: loaded in the chosen dtype on the chosen device, checkpointed, LoRA-wrapped."""
    import torch
    from transformers import AutoModelForCausalLM

    device, dtype = cfg.resolved_device(), cfg.resolved_dtype()
    if dtype != torch.float32 and cfg.lora_rank <= 0:
        log.warning("full-parameter training in %s: AdamW updates below the %s resolution are lost; "
                    "use --dtype float32 or --lora-rank", dtype, dtype)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
    if cfg.gradient_checkpointing:
        model.config.use_cache = False  # the KV cache is useless in training and conflicts with recompute
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2 renamed it
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if cfg.lora_rank > 0:
        model = wrap_lora(model, cfg)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    log.info("policy %s on %s in %s: %.1fM of %.1fM parameters train%s", model_path, device, dtype,
             trainable / 1e6, total / 1e6, " (gradient checkpointing)" if cfg.gradient_checkpointing else "")
    return model


def wrap_lora(model: torch.nn.Module, cfg: PolicyLoadConfig) -> Any:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise RuntimeError("LoRA needs peft: pip install 'openclaw-rl[lora]'") from exc
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha or 2 * cfg.lora_rank, lora_dropout=cfg.lora_dropout,
                      target_modules=list(cfg.lora_targets), bias="none", task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # peft reads the attribute transformers 5 deprecated: a warning per run that
        warnings.filterwarnings(  # the user can do nothing about (the renamed attribute is what we set above)
            "ignore", message=".*is_gradient_checkpointing.*is deprecated", category=FutureWarning)
        return get_peft_model(model, lora)


def add_policy_arguments(p: Any) -> None:
    """The CLI flags of ``PolicyLoadConfig``."""
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 … (default: cuda if available)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="trainer weights (default: bfloat16 for LoRA on GPU, float32 otherwise)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations (long prompts)")
    p.add_argument("--lora-rank", type=int, default=0, help="train LoRA adapters of this rank (needs peft)")
    p.add_argument("--lora-alpha", type=float, default=0.0, help="default: 2 x rank")
    p.add_argument("--lora-targets", default=",".join(DEFAULT_LORA_TARGETS), help="comma-separated module names")


def policy_config_from_cli(ns: Any) -> PolicyLoadConfig:
    return PolicyLoadConfig(device=ns.device, dtype=ns.dtype, gradient_checkpointing=ns.gradient_checkpointing,
                            lora_rank=ns.lora_rank, lora_alpha=ns.lora_alpha,
                            lora_targets=tuple(t for t in ns.lora_targets.split(",") if t))
