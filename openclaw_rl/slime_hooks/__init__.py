"""Slime-facing glue: the rollout bridge, ``TrainingSample`` → Slime ``Sample``, Slime feature checks.

It lives under ``openclaw_rl`` rather than in ``slime_plugins``: a Slime checkout ships a *regular*
``slime_plugins`` package and Ray puts the job's script directory (that checkout) first on
``sys.path``, so any module under our ``slime_plugins`` can be shadowed. Every dotted path the launch
scripts hand to Slime names a module under ``openclaw_rl`` / ``openclaw_opd`` / ``openclaw_combine``.
"""
