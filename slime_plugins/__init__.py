"""openclaw-rl's portion of the ``slime_plugins`` package: compatibility re-exports only.

Slime ships its own top-level ``slime_plugins`` (a regular package with ``slime_plugins.models``).
``extend_path`` lets ours merge with it when ours comes first, but nothing may depend on that: the
hooks the launch scripts name live in ``openclaw_rl`` / ``openclaw_opd`` / ``openclaw_combine``.
"""

__path__ = __import__("pkgutil").extend_path(__path__, __name__)
