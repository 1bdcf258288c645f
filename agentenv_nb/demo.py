"""``python -m agentenv_nb.demo [OUT]``: the four notebooks on the tiny bundle and model, on CPU
(``notebook.runner``)."""

from agentenv_nb.notebook.runner import main

if __name__ == "__main__":
    main()
