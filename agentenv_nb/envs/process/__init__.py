"""The ``process`` sandbox: a bundle's plain-Python MCP env as a local process, with no Docker. ``sandbox`` is
agent_env's provider; ``image`` reads an env image (its ``dockerfile``) into the work dir; ``pool`` keeps env
processes ready, each set up by ``zygote``; ``deaths`` tells a client the env under its episode died."""
