"""What the notebooks show and run: ``params`` (parameters from the environment), ``preflight`` (the checks before
a GPU run), ``views`` and ``transcript`` (a bundle's tasks, a played task), ``curves`` (the eval curve) and ``demo``
(the four notebooks top to bottom, ``python -m agentenv_nb.notebook.demo``)."""
