"""``python -m openclaw_rl.launch plan <variant> ...`` (see ``plan``)."""

import sys

from .plan import main

sys.exit(main())
