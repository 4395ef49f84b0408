"""openclaw-rl's Slime hooks, plus the loss maths the Slime path and the embedded trainer share.

The hooks adapt Slime's call signatures to our core (rollout bridge, sample conversion). The loss side
is ``policy_math`` (pure PPO/KL/GRPO tensor functions), ``logprobs`` (packed logits to per-token
log-probs, vocab-parallel aware) and ``policy_loss`` (PPO in Slime's custom-loss signature). Both
trainers call these same functions, so the two paths cannot drift apart.
"""
