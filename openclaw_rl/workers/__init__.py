"""``serve --workers N``: one owner process (session tracker, judge, spool writer) and N HTTP worker processes.

Stage: client → workers → owner → sessions → spool. ``supervisor.py`` starts them, ``app.py`` is a
worker, ``owner.py`` the owner's side, ``wire.py`` the records between them, ``remote.py`` a worker's
tracker. See docs/performance.md (item 5) for why and what it measured.
"""
