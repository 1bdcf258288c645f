"""``python -m agentenv_nb.envs.serve``: the serve command (``agentenv_nb.envs.serve.command``)."""

from agentenv_nb.envs.serve.command import main

main()
