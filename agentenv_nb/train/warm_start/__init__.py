"""The SFT warm start's data: ``sources`` (which the bundle gets: its expert, a user's demonstrations, or the model's
own best rollouts), ``demos`` (the expert's episodes and self-distillation rounds), ``user_demos`` (a JSONL checked
against the bundle's tools)."""
