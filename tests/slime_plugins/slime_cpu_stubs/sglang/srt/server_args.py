"""The SGLang server flags the launch scripts pass, plus those Slime's SGLang validation reads."""

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
        parser.add_argument("--pp-size", "--pipeline-parallel-size", type=int, default=1)
        parser.add_argument("--dp-size", type=int, default=1)
        parser.add_argument("--enable-dp-attention", action="store_true")
