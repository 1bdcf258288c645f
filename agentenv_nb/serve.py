"""``python -m agentenv_nb.serve BUNDLE``: serve a bundle's tasks for trainers on other hosts (``envs.serving``)."""

from agentenv_nb.envs.serving import main

if __name__ == "__main__":
    main()
