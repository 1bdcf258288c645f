"""Training, by stage: ``model`` (loading a model for a preset, its chat template, the tiny offline models, vLLM's
share of the card), ``warm_start`` (notebook 02's SFT data: an expert's, a user's, the model's own), ``grpo``
(notebook 03's run, its trainers and the training command), ``export`` (the trained model out). Shared by the stages:
``presets`` (every trainer setting as data, what it becomes on this machine, TRL's configs built from it and
checked), ``rollout`` (playing a model through the envs as TRL does), ``sessions`` (the env sessions a notebook or a
run holds at once), ``fit`` (a trainer run as a cell should), ``health`` (a run's signs of trouble, said once),
``live`` (the live plot), ``progress`` (a log's numbers, a loop's progress line). Import unsloth first:
``agentenv_nb.stack.import_unsloth``."""
