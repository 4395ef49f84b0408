"""The trainer's tail forward (last layer on the kept rows only) equals the model's own forward."""

from __future__ import annotations

import logging

import pytest
import torch

from openclaw_rl.embedded.tail_forward import response_rows_logits, tail_forward_usable
from openclaw_rl.embedded.tiny_model import PRESETS


def qwen3(preset: str = "h128", **overrides):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=512, dtype="float32", **{**PRESETS[preset], **overrides}))


def grads(model, tokens, keep, tail):
    model.zero_grad(set_to_none=True)
    logits = response_rows_logits(model, tokens, keep, tail)
    logits.log_softmax(-1)[:, 3].sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("preset", ["h64", "h256"])  # 2 and 4 layers
def test_logits_and_gradients_equal_the_full_forward(preset):
    model = qwen3(preset)
    assert tail_forward_usable(model)
    tokens = torch.randint(0, 512, (700,), generator=torch.Generator().manual_seed(1))
    for keep in (1, 17, 699):
        full, full_grads = grads(model, tokens, keep, tail=False)
        tail, tail_grads = grads(model, tokens, keep, tail=True)
        assert tail.shape == full.shape == (keep, 512)
        torch.testing.assert_close(tail, full, rtol=0, atol=1e-5)
        for name, g in full_grads.items():  # fp32 summation order: relative to the gradient's scale
            torch.testing.assert_close(tail_grads[name], g, rtol=0, atol=1e-5 * float(g.abs().max()))


def test_keeping_every_row_is_the_plain_forward():
    model = qwen3()
    tokens = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(response_rows_logits(model, tokens, 40, True), response_rows_logits(model, tokens, 40, False))


def test_models_it_does_not_reproduce_get_the_plain_forward(caplog):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    caplog.set_level(logging.INFO, logger="openclaw_rl.embedded.tail_forward")
    other = Qwen2ForCausalLM(Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    assert not tail_forward_usable(other)
    assert not tail_forward_usable(qwen3(attention_dropout=0.1))
    assert "is not a plain Qwen3ForCausalLM" in caplog.text and "attention dropout" in caplog.text


def test_an_attention_forward_it_does_not_copy_fails_the_check():
    """The tail forward re-states Qwen3's last layer; a transformers change there must not pass silently."""
    model = qwen3()
    attn = model.model.layers[-1].self_attn
    assert tail_forward_usable(model)
    own = attn.forward
    attn.forward = lambda *a, **k: (own(*a, **k)[0] * 1.01, None)  # what a changed Qwen3Attention would do
    assert not tail_forward_usable(model)
