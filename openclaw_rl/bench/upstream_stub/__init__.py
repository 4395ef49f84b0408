"""A stand-in ``slime`` for running upstream OpenClaw-RL's proxy unmodified in the side-by-side benchmark.

Upstream's ``openclaw_api_server.py`` imports exactly two things from Slime: ``load_tokenizer`` and
``Sample``. This folder is put first on ``sys.path`` of the benchmark's upstream process only (it is
never imported by the proxy itself), so the real Slime, with its GPU stack, is not needed.
"""
