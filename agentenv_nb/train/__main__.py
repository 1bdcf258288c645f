"""``python -m agentenv_nb.train``: notebook 03's GRPO run as a command (``agentenv_nb.train.command``)."""

import sys

from agentenv_nb.train.command import main

sys.exit(main())
