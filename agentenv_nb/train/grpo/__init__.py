"""GRPO: ``run`` (the run's parameters and its steps, which notebook 03, the command and the benchmarks call),
``trainer`` (the kit's two GRPO trainers), ``trial`` (one step at the worst case first), ``command``
(``python -m agentenv_nb.train``), with ``launch`` and ``ranks`` for several GPUs."""
