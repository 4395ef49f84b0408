"""The trainer's forward for a Qwen3 model: the last decoder layer runs only on the rows that are read.

Why: the trainer needs logits only for the R + 1 rows that predict a sample's response, but a plain
forward runs every layer on all T positions. The layers below the last must (their keys and values
over the whole prompt feed the response rows), the last one need not: its queries, MLP and norm
matter only for the kept rows, while its keys and values still come from all T positions. For the
2-layer tiny model at 25K tokens this removes about half of the attention work, forward and backward.

Exactness: the kept rows see exactly the keys and values of the full forward (causal, aligned to the
end of the sequence); only the floating-point order of the last layer's attention differs. The
trainer asks `tail_forward_usable` once for its model, which checks the result against the model's
own forward on a short sequence; a model this code does not reproduce (another architecture, a PEFT
wrapper, dropout, a changed transformers layer) gets the plain forward instead, with a log line saying why.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

_CHECK_TOKENS, _CHECK_KEEP, _CHECK_ATOL = 48, 9, 1e-4


def _supported(model: torch.nn.Module) -> str:
    """'' if the tail forward reproduces `model`, else the reason it does not."""
    try:
        from transformers import Qwen3ForCausalLM
    except ImportError:
        return "transformers has no Qwen3"
    if type(model) is not Qwen3ForCausalLM:
        return f"{type(model).__name__} is not a plain Qwen3ForCausalLM"
    config = model.config
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return f"attention implementation {config._attn_implementation!r}"
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        return "sliding-window layers"
    if float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0:
        return "attention dropout"
    return ""


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    return apply_rotary_pos_emb(x, x, cos, sin)[0]


def _tail_logits(model: torch.nn.Module, tokens: torch.Tensor, keep: int) -> torch.Tensor:
    """[keep, V] logits of the last `keep` positions; every layer but the last on all positions."""
    inner = model.model
    total = tokens.numel()
    positions = torch.arange(total, device=tokens.device).unsqueeze(0)
    hidden = inner.embed_tokens(tokens.unsqueeze(0))
    cos, sin = inner.rotary_emb(hidden, positions)
    for layer in inner.layers[: model.config.num_hidden_layers - 1]:
        hidden = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=(cos, sin))
    last = inner.layers[model.config.num_hidden_layers - 1]
    attn = last.self_attn
    normed = last.input_layernorm(hidden)
    q = attn.q_norm(attn.q_proj(normed[:, -keep:]).view(1, keep, -1, attn.head_dim)).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(normed).view(1, total, -1, attn.head_dim)).transpose(1, 2)
    v = attn.v_proj(normed).view(1, total, -1, attn.head_dim).transpose(1, 2)
    q, k = _rope(q, cos[:, -keep:], sin[:, -keep:]), _rope(k, cos, sin)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    # kept row i sits at position total - keep + i and sees keys 0 .. total - keep + i: [keep, total] booleans
    visible = torch.ones(keep, total, dtype=torch.bool, device=tokens.device).tril(total - keep)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=attn.scaling)
    hidden = hidden[:, -keep:] + attn.o_proj(out.transpose(1, 2).reshape(1, keep, -1))
    hidden = hidden + last.mlp(last.post_attention_layernorm(hidden))
    return model.lm_head(inner.norm(hidden))[0]


def tail_forward_usable(model: torch.nn.Module) -> bool:
    """Whether `model` (and copies of it) can use the tail forward: supported, and equal to its own forward."""
    why = _supported(model)
    if not why:
        gen = torch.Generator().manual_seed(0)
        probe = torch.randint(0, model.config.vocab_size, (_CHECK_TOKENS,), generator=gen).to(
            next(model.parameters()).device)
        with torch.no_grad():
            want = model(input_ids=probe.unsqueeze(0), logits_to_keep=_CHECK_KEEP, use_cache=False).logits[0]
            got = _tail_logits(model, probe, _CHECK_KEEP)
        gap = (got.float() - want.float()).abs().max().item()
        why = "" if gap <= _CHECK_ATOL else f"it differs from the model's own forward by {gap:.1e}"
    if why:
        log.info("trainer forward: the full model on every position (%s)", why)
    return not why


def response_rows_logits(model: torch.nn.Module, tokens: torch.Tensor, keep: int, tail: bool) -> torch.Tensor:
    """[keep, V] logits of the last `keep` positions of one unpadded sample (no attention mask: causal);
    `tail`: `model` passed `tail_forward_usable`, so its last layer runs on the kept rows only."""
    if tail and keep < tokens.numel():
        return _tail_logits(model, tokens, keep)
    return model(input_ids=tokens.unsqueeze(0), logits_to_keep=keep, use_cache=False).logits[0, -keep:]
