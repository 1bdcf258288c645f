"""``python -m agentenv_nb.train``: notebook 03's GRPO run as a command (``agentenv_nb.train.grpo.command``)."""

import sys

from agentenv_nb.train.grpo.command import main

sys.exit(main())
