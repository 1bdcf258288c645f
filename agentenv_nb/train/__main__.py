"""``python -m agentenv_nb.train``: notebook 03's GRPO run as a command (``agentenv_nb.train.grpo.command``);
``python -m agentenv_nb.train sft``: notebook 02's SFT warm start (``agentenv_nb.train.warm_start.command``)."""

import sys

if sys.argv[1:2] == ["sft"]:
    from agentenv_nb.train.warm_start.command import main

    sys.exit(main(sys.argv[2:]))
from agentenv_nb.train.grpo.command import main

sys.exit(main())
