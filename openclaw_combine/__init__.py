"""Mode ``combine``: one PPO loss on w_opd * (teacher - old) + w_rl * GRPO advantage per token."""
