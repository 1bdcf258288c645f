"""agentenv_nb: train LLM agents on agent-task bundles with Unsloth's GRPO, from a notebook.

    from agentenv_nb import AgentEnv, bundles
    env = AgentEnv.local(bundles.get_bundle("gridsim-tiny"), split="train", sandbox="process")

Imports stay light: the trainer stack loads only when a module that needs it is used.
"""

from .stack import hide_broken_torchvision

hide_broken_torchvision()  # before anything imports transformers, which a broken torchvision breaks for good

__all__ = ["AgentEnv"]


def __getattr__(name: str):
    if name == "AgentEnv":
        from .client import AgentEnv

        return AgentEnv
    raise AttributeError(f"module 'agentenv_nb' has no attribute {name!r}")
