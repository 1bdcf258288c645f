"""What the notebooks show and run: ``params`` (parameters from the environment), ``preflight`` (the checks before
a GPU run), ``live`` (the live training plot, notebook or console), ``curves`` (the eval curve) and ``runner`` (the
four notebooks top to bottom, ``python -m agentenv_nb.demo``)."""
