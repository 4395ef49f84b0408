"""The loss maths both trainers share: Slime's actor (through the hooks) and the embedded CPU trainer.

``policy_math`` holds the pure PPO / KL / GRPO tensor functions, ``logprobs`` turns packed logits into
per-token log-probs (with this project's own vocab-parallel path under Megatron TP), ``policy_loss``
is PPO in Slime's custom-loss signature. The modes (``openclaw_opd.loss``, ``openclaw_combine.loss``)
build on these. Nothing here imports a private Slime symbol, and nothing depends on the
``slime_plugins`` package name, which a Slime checkout owns (see ``openclaw_rl.slime_hooks``).
"""
