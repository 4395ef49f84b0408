"""OEL's settings section (``openclaw_oel_*``, ``settings.oel``).

Stage: configuration. A module of its own with no imports beyond the standard library, because
``config.py`` resolves every mode's settings dataclass wherever settings are loaded (the launch plan's
bare Python included), and the scorer module imports the HTTP client.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OELSettings:
    topk: int = 50  # teacher top-K per response token (upstream K=50); the loss is top-K + tail reverse KL
    max_experience_tokens: int = 2048  # the experience's cap in policy tokens (whole rules kept)
    accumulate: bool = False  # upstream SESSION_EXPERIENCE: merge with the user's stored experience
