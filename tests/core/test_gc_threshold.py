"""The proxy makes young collections rare once it has started (server.rare_young_collections, issue #33 item 2)."""

from __future__ import annotations

import gc

from openclaw_rl.server import YOUNG_GC_THRESHOLD, rare_young_collections


def test_start_up_raises_the_young_threshold_and_keeps_the_older_ones() -> None:
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        rare_young_collections()
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, 10, 10)
        gc.set_threshold(50_000, 5, 5)  # a higher one set by whoever runs the proxy stays
        rare_young_collections()
        assert gc.get_threshold() == (50_000, 5, 5)
        gc.set_threshold(0)  # collection switched off stays off
        rare_young_collections()
        assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*saved)
