class RouterArgs:
    @staticmethod
    def add_cli_args(parser, use_router_prefix=False, exclude_host_port=False):
        return parser
