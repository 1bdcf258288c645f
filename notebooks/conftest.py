"""nbval runs the notebooks on the tiny bundle and model, on CPU, all four writing under one temporary run
folder, so each picks up what the one before it made."""

import tempfile

from agentenv_nb.notebook.params import use_tiny_defaults

use_tiny_defaults(tempfile.mkdtemp(prefix="agentenv_nb-notebooks-"))
