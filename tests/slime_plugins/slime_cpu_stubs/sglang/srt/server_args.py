"""The SGLang server flags the launch scripts pass, plus those either Slime reads from its parsed args.

The parallel sizes are registered as SGLang did up to early 2026 (``--data-parallel-size`` first, so the
argparse dest is the long name): the Slime bundled in Gen-Verse/OpenClaw-RL reads
``args.sglang_data_parallel_size`` and friends, and current THUDM/slime accepts either naming (its
``validate_args`` fills in the short names from the long ones).
"""

import dataclasses


@dataclasses.dataclass
class ServerArgs:
    model_path: str = ""

    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model-path")
        parser.add_argument("--tool-call-parser")
        parser.add_argument("--reasoning-parser")
        parser.add_argument("--mem-fraction-static", type=float)
        parser.add_argument("--context-length", type=int)
        parser.add_argument("--incremental-streaming-output", action="store_true")  # passed by the launch scripts
        parser.add_argument("--pipeline-parallel-size", "--pp-size", type=int, default=1)
        parser.add_argument("--data-parallel-size", "--dp-size", type=int, default=1)
        parser.add_argument("--expert-parallel-size", "--ep-size", type=int, default=1)
        parser.add_argument("--enable-dp-attention", action="store_true")
        parser.add_argument("--speculative-algorithm")  # read by Slime's rollout metrics (None: no speculation)
        parser.add_argument("--enable-metrics", action="store_true")  # read by the bundled Slime's wandb setup
