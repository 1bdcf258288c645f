"""Training: ``presets`` (every trainer default in one place), ``models`` (loading, warm-start saving), ``tiny``
(offline random Qwen3-format models), ``rollout`` (playing a model through the envs as TRL does) and ``demos``
(expert and self-distillation SFT data). Import unsloth first: ``agentenv_nb.stack.import_unsloth``."""
