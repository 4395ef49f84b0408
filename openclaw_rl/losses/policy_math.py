"""Pure PPO / KL / GRPO tensor maths shared by every loss in this project.

The Slime path and the embedded CPU trainer must compute the same numbers. When Slime is importable we
call its own ``slime.utils.ppo_utils`` functions, so a GPU run uses exactly Slime's maths; otherwise the
``torch_*`` twins below, which implement the same formulas, are used. The twins stay public so tests can
pin them down even on a machine that has Slime.

One deliberate difference: Slime's ``compute_approx_kl`` casts its inputs to float32, the twin keeps
float64 in float64 (half precision is still upcast) so gradcheck can run on it. For the float32/bf16
tensors a real run produces, the results are identical.

Not here: anything that touches logits layout or process groups (see ``logprobs``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from types import ModuleType

import torch

KL_TYPES = ("k1", "k2", "k3", "low_var_kl")
GRPO_STD_EPS = 1e-6  # added to the group std before dividing, as Slime does


def _load_slime_ppo_utils() -> ModuleType | None:
    try:
        from slime.utils import ppo_utils
    except ImportError:
        return None
    return ppo_utils


# Resolved once at import; tests swap it to exercise the delegation without Slime installed.
_SLIME_PPO: ModuleType | None = _load_slime_ppo_utils()


def _accepts(fn: Callable[..., object], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """Upcast half/bfloat16 to float32; float32 and float64 pass through untouched (no copy)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


# --- KL estimators ------------------------------------------------------------------------------------


def compute_approx_kl(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    kl_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate (Schulman's k1/k2/k3), Slime's when available.

    ``low_var_kl`` is k3 clamped to [-10, 10]; ``importance_ratio`` (pi/pi_old) makes the estimate
    unbiased under off-policy samples and is applied before that clamp.
    """
    if kl_type not in KL_TYPES:
        raise ValueError(f"unknown kl_type {kl_type!r}; expected one of {KL_TYPES}")
    slime_fn = getattr(_SLIME_PPO, "compute_approx_kl", None)
    if slime_fn is not None and (importance_ratio is None or _accepts(slime_fn, "importance_ratio")):
        extra = {} if importance_ratio is None else {"importance_ratio": importance_ratio}
        return slime_fn(log_probs, ref_log_probs, kl_loss_type=kl_type, **extra)
    return torch_compute_approx_kl(log_probs, ref_log_probs, kl_type, importance_ratio)


def torch_compute_approx_kl(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    kl_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same estimators in plain torch (used when Slime is absent)."""
    log_ratio = at_least_fp32(log_probs) - at_least_fp32(ref_log_probs)
    if kl_type == "k1":
        kl = log_ratio
    elif kl_type == "k2":
        kl = log_ratio.square() / 2.0
    elif kl_type in ("k3", "low_var_kl"):
        # With x = ref - logp: exp(x) - 1 - x >= 0, unbiased and lower variance than k1.
        neg_log_ratio = -log_ratio
        kl = neg_log_ratio.exp() - 1 - neg_log_ratio
    else:
        raise ValueError(f"unknown kl_type {kl_type!r}; expected one of {KL_TYPES}")
    if importance_ratio is not None:
        kl = importance_ratio * kl
    if kl_type == "low_var_kl":
        kl = kl.clamp(min=-10, max=10)
    return kl


# --- PPO clipped surrogate ------------------------------------------------------------------------------


def compute_policy_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss and clip indicator from ``ppo_kl = old - new`` (ratio = exp(-ppo_kl)).

    Asymmetric clip to [1 - eps_clip, 1 + eps_clip_high]; with ``eps_clip_c`` (> 1) the dual clip caps
    the loss of negative-advantage tokens at ``-eps_clip_c * A``. Returns ``(pg_losses, clipfrac)``,
    clipfrac being 1.0 where the clipped term won.
    """
    slime_fn = getattr(_SLIME_PPO, "compute_policy_loss", None)
    if slime_fn is not None:
        return slime_fn(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c=eps_clip_c)
    return torch_compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c)


def torch_compute_policy_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same clipped surrogate in plain torch (used when Slime is absent)."""
    ratio = (-ppo_kl).exp()
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages
    pg_losses = torch.maximum(unclipped, clipped)
    clipfrac = torch.gt(clipped, unclipped).float()
    if eps_clip_c is not None:
        if eps_clip_c <= 1.0:
            raise ValueError(f"dual-clip eps_clip_c must be > 1.0, got {eps_clip_c}")
        capped = torch.minimum(-eps_clip_c * advantages, pg_losses)
        pg_losses = torch.where(advantages < 0, capped, pg_losses)
    return pg_losses, clipfrac


# --- Entropy ------------------------------------------------------------------------------------------


def entropy_from_log_probs(log_probs_RV: torch.Tensor) -> torch.Tensor:
    """Entropy per row from a full log-softmax; -inf entries (masked vocab) contribute 0, not NaN."""
    finite_RV = log_probs_RV.clamp(min=torch.finfo(log_probs_RV.dtype).min)
    return -(log_probs_RV.exp() * finite_RV).sum(dim=-1)


def entropy_from_logits(logits_RV: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per row, computed in at least float32 (single device, no TP)."""
    return entropy_from_log_probs(torch.log_softmax(at_least_fp32(logits_RV), dim=-1))


# --- Reduction ------------------------------------------------------------------------------------------


def make_sum_of_sample_mean(
    response_lengths: Sequence[int], loss_masks: Sequence[torch.Tensor]
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Build Slime's reducer: sum over samples of the masked per-sample token mean.

    ``x_T`` is the concatenation of every sample's per-token values. A sample's denominator is
    ``max(sum(mask), 1)``, so an all-masked or empty sample contributes exactly 0 (it still counts as a
    sample in whatever the caller divides by, as in Slime).
    """
    lengths = [int(n) for n in response_lengths]
    if len(lengths) != len(loss_masks):
        raise ValueError(f"{len(lengths)} response lengths but {len(loss_masks)} loss masks")
    for i, (n, mask) in enumerate(zip(lengths, loss_masks, strict=True)):
        if mask.numel() != n:
            raise ValueError(f"sample {i}: loss mask has {mask.numel()} entries, response length is {n}")
    total_len = sum(lengths)

    def sum_of_sample_mean(x_T: torch.Tensor) -> torch.Tensor:
        if x_T.numel() != total_len:
            raise ValueError(f"expected {total_len} per-token values, got {x_T.numel()}")
        total = x_T.new_zeros(())
        for x_R, mask in zip(x_T.split(lengths), loss_masks, strict=True):
            mask_R = mask.to(device=x_R.device, dtype=x_R.dtype)
            total = total + (x_R * mask_R).sum() / mask_R.sum().clamp(min=1)
        return total

    return sum_of_sample_mean


# --- GRPO advantages ------------------------------------------------------------------------------------


def normalize_group_rewards(
    rewards_N: torch.Tensor, group_indices: Sequence[int], std_normalize: bool = False
) -> torch.Tensor:
    """Centre rewards on their group mean; optionally divide by (std + 1e-6) for groups of > 1.

    Groups are keyed by ``group_index`` (not position), as in OpenClaw's bundled Slime. A singleton
    group centres to 0 and is never std-divided. The std is the unbiased one (torch's default), as in
    Slime's GRPO normalisation.
    """
    if len(group_indices) != rewards_N.numel():
        raise ValueError(f"{len(group_indices)} group indices for {rewards_N.numel()} rewards")
    members: dict[int, list[int]] = {}
    for position, group in enumerate(group_indices):
        members.setdefault(int(group), []).append(position)
    out_N = rewards_N.clone()
    for positions in members.values():
        index = torch.tensor(positions, dtype=torch.long)
        group_N = rewards_N[index]
        centred = group_N - group_N.mean()
        if std_normalize and len(positions) > 1:
            centred = centred / (group_N.std() + GRPO_STD_EPS)
        out_N[index] = centred
    return out_N


def grpo_advantages(
    rewards: Sequence[float] | torch.Tensor,
    response_lengths: Sequence[int],
    group_indices: Sequence[int] | None = None,
    normalize: bool = False,
    std_normalize: bool = False,
) -> list[torch.Tensor]:
    """Per-token GRPO advantages: each sample's (optionally group-normalised) reward on every token.

    ``normalize=False`` is Slime's ``--disable-rewards-normalization`` (the rl and combine modes):
    A_t = r. Returned tensors are float32, like Slime's.
    """
    rewards_N = torch.as_tensor(rewards, dtype=torch.float32).reshape(-1)
    lengths = [int(n) for n in response_lengths]
    if rewards_N.numel() != len(lengths):
        raise ValueError(f"{rewards_N.numel()} rewards for {len(lengths)} samples")
    if std_normalize and not normalize:
        raise ValueError("std_normalize only applies with normalize=True")
    if normalize:
        if group_indices is None:
            raise ValueError("normalize=True needs group_indices (one group index per sample)")
        rewards_N = normalize_group_rewards(rewards_N, group_indices, std_normalize)
    slime_fn = getattr(_SLIME_PPO, "get_grpo_returns", None)
    shapes = [torch.zeros(n, dtype=torch.float32) for n in lengths]
    if slime_fn is not None:
        return list(slime_fn(rewards_N, shapes))
    return [torch.ones_like(shape_R) * reward for shape_R, reward in zip(shapes, rewards_N, strict=True)]
