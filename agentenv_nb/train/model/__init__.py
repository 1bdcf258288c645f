"""The model: ``loading`` (a model loaded for a preset, a warm start saved), ``tool_template`` (a chat template TRL
can parse tool calls from), ``tiny`` (random models built offline), ``vllm_sizing`` (vLLM's share of the card and the
precision of its weights)."""
