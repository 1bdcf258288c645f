"""Envs: where a bundle's envs run and how its tasks are served. ``choice`` picks the sandbox (Docker, Modal with
``modal_credentials``, or the kit's ``process_sandbox``: plain-Python envs as local processes, read from their
``image``, kept ready in a ``pool``, each set up by ``zygote``); ``serving`` runs agent_env's OpenEnv server on a
thread, from processes, or as ``python -m agentenv_nb.serve``."""
