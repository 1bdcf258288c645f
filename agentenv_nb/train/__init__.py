"""Training, by stage: ``model`` (loading a model for a preset, its chat template, the tiny offline models),
``warm_start`` (notebook 02's run, its command and its SFT data: an expert's, a user's, the model's own), ``grpo``
(notebook 03's run, its trainers and the training command), ``export`` (the trained model out). Shared by the stages:
``run`` (what every stage's run shares: the bundle, RUN_DIR and the envs) with ``options`` (a run as a command's
options), ``presets`` (every trainer setting as data, what it becomes on this machine, vLLM's share of the card,
TRL's configs built from it and checked), ``rollout`` (playing a model through the envs as TRL does), ``sessions``
(the env sessions a notebook or a run holds at once), ``fit`` (a trainer run as a cell should), ``health`` (a run's
signs of trouble, said once), ``live`` (the live plot), ``progress`` (a log's numbers, a loop's progress line).
Import unsloth first: ``agentenv_nb.stack.import_unsloth``."""
