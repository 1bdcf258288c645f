"""Serving a resolved bundle's app (``envs.app``): ``thread`` serves it on a thread of this process
(``AgentEnv.local``), ``processes`` from server processes beside this one (``AgentEnv.local(..., processes=N)``), and
``command`` is ``python -m agentenv_nb.envs.serve``, which an env host runs and each server process is."""
