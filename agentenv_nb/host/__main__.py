"""``python -m agentenv_nb.host``: the set-up step (``host.install``)."""

from agentenv_nb.host.install import main

if __name__ == "__main__":
    main()
