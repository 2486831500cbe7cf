"""``python -m llm_lb_gym.experiments COMMAND [ARGS...]``: the same dispatcher as ``llm-lb-gym``."""

import sys

from llm_lb_gym.experiments.cli import main

sys.exit(main())
