"""The model: ``loading`` (a model loaded for a preset, a warm start saved), ``tool_template`` (a chat template TRL
can parse tool calls from), ``tiny`` (random models built offline)."""
