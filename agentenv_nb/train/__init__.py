"""Training: ``presets`` (every trainer setting, as data), ``configs`` (TRL's configs built from them and checked),
``run`` (notebook 03's parameters), ``models`` (loading, warm-start saving), ``tiny`` (offline random Qwen3-format
models), ``rollout`` (playing a model through the envs as TRL does) and ``demos`` (expert and self-distillation SFT
data). Import unsloth first: ``agentenv_nb.stack.import_unsloth``."""
