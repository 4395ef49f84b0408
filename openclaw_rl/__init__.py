"""openclaw-rl: train a self-hosted policy online from its agent's real conversations.

The core (proxy, sessions, judge, spool, rollout bridge) lives in this package together with the
Binary RL mode; ``openclaw_opd`` and ``openclaw_combine`` add the other two modes, ``openclaw_rl.losses``
the shared loss maths and ``openclaw_rl.slime_hooks`` the Slime-facing glue. See README.md for the flow.
"""

__version__ = "0.1.0"
