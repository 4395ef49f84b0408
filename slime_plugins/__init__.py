"""openclaw-rl's portion of the ``slime_plugins`` package.

Slime ships its own top-level ``slime_plugins`` (``slime_plugins.models`` and friends). Our hooks live in
``slime_plugins.openclaw``; ``extend_path`` merges every ``slime_plugins`` directory on ``sys.path`` into
one package, so putting this repository first on ``PYTHONPATH`` extends Slime's package instead of
shadowing it.
"""

__path__ = __import__("pkgutil").extend_path(__path__, __name__)
