"""TRL's config classes as the kit builds them: made after ``import unsloth`` (on a GPU, Unsloth's rewrite of
them), then checked to keep every argument they were given, since that rewrite changes some defaults and values.

    config = build("GRPOConfig", {"output_dir": "out", "learning_rate": 2e-5, ...})   # raises on any drift
    before = copy.deepcopy(config); trainer = GRPOTrainer(args=config, ...)
    check_config(trainer.args, before)                                               # the trainer kept them too
"""

from __future__ import annotations

import dataclasses

from agentenv_nb.stack import import_unsloth


_MODULES = {"AsyncGRPOConfig": "trl.experimental.async_grpo"}  # configs not in trl's top level


def build(config_class: str, expected: dict):
    """TRL's ``config_class`` (Unsloth's rewrite, on a GPU) made from ``expected``, checked to keep every setting."""
    import_unsloth()
    import importlib

    config = getattr(importlib.import_module(_MODULES.get(config_class, "trl")), config_class)(**expected)
    check_config(config, expected)
    return config


def unsloth_rewrites() -> bool:
    """Whether ``trl.GRPOConfig`` is Unsloth's rewrite (on a GPU), not stock TRL (on a CPU)."""
    import_unsloth()
    import trl

    return _stock_class(trl.GRPOConfig) is not trl.GRPOConfig


def scale_rewards_argument(scaling, loss_type: str):
    """What to give GRPOConfig as ``scale_rewards`` for TRL's ``scaling``: Unsloth's rewrite turns "group" (True)
    off for dr_grpo, keeping it only for None, which stock TRL rejects at the first step."""
    keeps_group = scaling in ("group", True) and loss_type.lower() == "dr_grpo" and unsloth_rewrites()
    return None if keeps_group else scaling


def _stock_class(cls: type) -> type:
    """TRL's own config class under an Unsloth rewrite, or ``cls`` itself.

    Unsloth's class subclasses TRL's and takes its module and name, so it is told apart by the
    ``unsloth_*`` fields it adds (``unsloth_num_chunks``, ...).
    """
    return next(c for c in cls.__mro__
                if not any(name.startswith("unsloth_") for name in getattr(c, "__dataclass_fields__", {})))


def config_drift(config, expected) -> dict[str, tuple]:
    """Settings whose value in ``config`` differs from ``expected``: {name: (expected, actual)}.

    ``expected`` is either the arguments a config was built from, compared as TRL's own config class
    makes them (its enums, "group"), or an earlier copy of the config, compared field by field: a
    ``copy.deepcopy(config)`` taken before a trainer is built shows what the trainer changed. Build
    from arguments only before any trainer exists: a new TrainingArguments resets accelerate's state.
    """
    if isinstance(expected, dict):
        stock = dict(expected)
        if stock.get("scale_rewards", "group") is None:
            stock["scale_rewards"] = "group"  # what Unsloth's None means: TRL's default scaling
        reference, names = _stock_class(type(config))(**stock), list(expected)
    else:
        reference, names = expected, [field.name for field in dataclasses.fields(expected)]
    return {name: (getattr(reference, name), getattr(config, name)) for name in names
            if getattr(reference, name) != getattr(config, name)}


def check_config(config, expected) -> None:
    """Raise if ``config`` lost any setting of ``expected`` (see ``config_drift``), e.g. to Unsloth's rewrite."""
    drift = config_drift(config, expected)
    if drift:
        lines = "\n".join(f"  {name}: set {want!r}, got {got!r}" for name, (want, got) in drift.items())
        raise ValueError(f"the trainer config does not keep these settings:\n{lines}")
