"""The Slime launch scripts' one typed configuration path.

``scripts/run_qwen3_4b_openclaw_<variant>.sh`` stay Bash (users run them per variant; they start and stop
processes), but everything they resolve, check and hand Slime is computed here, from their environment
and the variant's entry in the mode registry (``modes.LaunchVariant``):

- ``run_config``: the run config (``$RUN_DIR/openclaw_<mode>.yaml``) through ``config.Settings``;
- ``script``: the scripts' own variables (GPU split, tensor-parallel sizes, paths, tools, Slime features);
- ``slime_args``: the judge server, Ray head and ``ray job submit`` command lines with Slime's flags;
- ``layout``: where Slime's placement group puts the actor ranks and engines over several nodes, and the
  layouts that cannot work;
- ``memory``: TP, context parallelism and tokens per GPU for long samples, with the arithmetic;
- ``plan``: ``python -m openclaw_rl.launch plan <variant>``, which the scripts ``eval``.
"""

from .run_config import SCRIPT_ENV, LaunchError

__all__ = ["SCRIPT_ENV", "LaunchError"]
