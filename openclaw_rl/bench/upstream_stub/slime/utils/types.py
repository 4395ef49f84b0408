"""Benchmark stub of ``slime.utils.types``: a plain ``Sample`` with the fields upstream's proxy sets."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass
class Sample:
    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"

    prompt: Any = ""
    response: str = ""
    tokens: list[int] = field(default_factory=list)
    response_length: int = 0
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    index: int | None = None
    group_index: int | None = None
    reward: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
