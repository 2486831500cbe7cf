"""``python -m experiments COMMAND [ARGS...]``: the same dispatcher as ``llm-lb-gym``."""

import sys

from experiments.cli import main

sys.exit(main())
