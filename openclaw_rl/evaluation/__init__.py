"""``openclaw-rl eval``: an end-to-end personalisation evaluation on a held-out suite (see command.py)."""
