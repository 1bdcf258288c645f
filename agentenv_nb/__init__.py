"""agentenv_nb: train LLM agents on agent-task bundles with Unsloth's GRPO, from a notebook.

The subpackages follow the flow: ``tasks`` (bundles, GridSim) -> ``envs`` (where envs run, serving) ->
``client`` (``AgentEnv``: TRL's dataset and environment_factory) -> ``train`` (presets, models, SFT and GRPO, the
live plot) -> ``notebook`` (parameters, preflight, eval curve, the demo); ``host`` reads the machine and installs
what fits it, before the rest. README.md's "The package" names every module.

    from agentenv_nb import AgentEnv
    from agentenv_nb.tasks import bundles
    env = AgentEnv.local(bundles.get_bundle("gridsim-tiny"), split="train")

Importing the package starts nothing and imports neither torch nor unsloth.
"""

__all__ = ["AgentEnv"]


def __getattr__(name: str):
    if name == "AgentEnv":
        from agentenv_nb.client import AgentEnv

        return AgentEnv
    raise AttributeError(f"module 'agentenv_nb' has no attribute {name!r}")
