"""The client: ``AgentEnv`` (``agentenv``), a served bundle as TRL's dataset and ``environment_factory``. Its
``runtime`` owns the event loop and the players; ``session`` is one OpenEnv WebSocket session; ``player`` one
episode played on it; ``environment`` the classes TRL plays, with a method per server tool (``tools``); ``checks``
before training; ``metrics`` per score."""

from agentenv_nb.client.agentenv import AgentEnv

__all__ = ["AgentEnv"]
