"""What every stage's run shares: ``Run``, the parameters of what it trains on, where it goes and the env servers,
with what makes a notebook's parameters cell and a command's options of any run's parameters (their names, help and
groups, headed as TRL's configs head their own: "Parameters that control ..."); and the steps that serve the bundle.
``warm_start.run.SFTRun`` (notebook 02) and ``grpo.run.GRPORun`` (notebook 03) add their stage's parameters.

    run = SFTRun.of(globals())            # a notebook's parameters cell; or SFTRun(bundle="gridsim-tiny")
    bundle = resolve_bundle(run)          # fetched, its sandbox chosen, its envs checked
    env = serve(run, bundle, sessions)    # from SERVER_PROCESSES processes beside this one, with REWARD and TOOLSETS
"""

from __future__ import annotations

import dataclasses
import typing

from agentenv_nb.envs.serve.processes import MOST_SERVERS, servers_for_host
from agentenv_nb.tasks.bundles import BUNDLES_DIR

SANDBOXES = ("auto", "process", "modal", "local")
PRESET_HELP = ("'auto': the preset that fits this card ('24gb', the recipe's, on 20 GB or more, vLLM's weights the "
               "fastest that fit; '16gb' below, as on a T4; 'cpu-tiny' with no GPU); or a name from presets.PRESETS "
               "('16bit': LoRA on 16-bit weights)")


def parameter(default, help: str, notebook_only: bool = False, opens: str = ""):
    """A parameter: its default, its help, whether only the notebook takes it; ``opens``: the group it opens."""
    return dataclasses.field(default=default, metadata={"help": help, "notebook_only": notebook_only, "opens": opens})


@dataclasses.dataclass(frozen=True)
class Run:
    """The parameters every stage's run takes: the data and where the run goes, the envs."""

    bundle: str = parameter("gridsim-v1", "a name from bundles.txt, or a bundle folder",
                            opens="the data, and where the run goes")
    bundles_dir: str = parameter(BUNDLES_DIR, "where bundles are downloaded or generated")
    run_dir: str = parameter("runs/gridsim", "where models, checkpoints, logs and plots go, a folder a stage: "
                                             "RUN_DIR/sft, RUN_DIR/grpo")

    sandbox: str = parameter("auto", "where envs run: 'auto' (chosen for the bundle), 'process', 'modal', 'local' "
                                     "(Docker)", opens="the envs")
    server_processes: int = parameter(servers_for_host(), "env servers beside the trainer, off its GIL (default: one "
                                                          f"a core, up to {MOST_SERVERS}); 0: a thread of this "
                                                          "process")
    reward: str = parameter("", "for tasks that record several scores: 'mean', 'min', 'max' of them, or a score's "
                                "step id; empty: the task's one score")
    toolsets: str = parameter("first", "'each' for a bundle whose tasks differ in tools (a class a toolset, each row "
                                       "routed to its own); 'first': the first task's tools are every task's")

    @classmethod
    def of(cls, parameters: dict):
        """The run a notebook's parameters cell sets: of ``parameters`` (its ``globals()``), the notebook's names."""
        return cls(**{field.name: parameters[field.name.upper()] for field in dataclasses.fields(cls)})

    def parameters(self) -> dict:
        """The parameters under the notebook's names: {"BUNDLE": ..., "RUN_DIR": ...}."""
        return {field.name.upper(): getattr(self, field.name) for field in dataclasses.fields(self)}

    def changed(self) -> dict:
        """The parameters, under the notebook's names, that differ from the defaults."""
        default = type(self)()
        return {name: value for name, value in self.parameters().items()
                if value != getattr(default, name.lower())}

    @classmethod
    def command_options(cls) -> list[str]:
        """The parameters the run's command takes too: all but those of the notebook's own cells."""
        return [field.name for field in dataclasses.fields(cls) if not field.metadata["notebook_only"]]

    @classmethod
    def help(cls, name: str) -> str:
        """What parameter ``name`` (``run_dir`` or ``RUN_DIR``) sets."""
        return cls.__dataclass_fields__[name.lower()].metadata["help"]

    @classmethod
    def groups(cls) -> dict[str, list[str]]:
        """The parameters by group, in order, under the words that end each heading ("Parameters that control ...")."""
        groups: dict[str, list[str]] = {}
        for field in dataclasses.fields(cls):
            groups.setdefault(field.metadata["opens"] or list(groups)[-1], []).append(field.name)
        return groups

    @classmethod
    def kind(cls, name: str) -> type:
        """The type of parameter ``name``'s values, None aside: ``int`` for ``server_processes``."""
        hint = typing.get_type_hints(cls)[name.lower()]
        return next((arg for arg in typing.get_args(hint) if arg is not type(None)), hint)


def resolve_bundle(run: Run):
    """The run's bundle resolved once (``envs.resolve``): fetched, its sandbox chosen, its envs checked."""
    from agentenv_nb.envs.resolve import resolve

    return resolve(run.bundle, run.sandbox, bundle_dir=run.bundles_dir)


def where_to_serve(run: Run):
    """The bundle resolved (``resolve_bundle``) for a command, on the process that will serve it, before anything slow
    starts: an unknown bundle or an impossible sandbox is said at once, in one line (``options.UsageError``)."""
    from agentenv_nb.envs.choice import SandboxError
    from agentenv_nb.tasks import bundles
    from agentenv_nb.train.options import UsageError

    try:
        return resolve_bundle(run)
    except (bundles.UnknownBundle, SandboxError, ValueError, RuntimeError) as error:  # ValueError: a bad setting
        raise UsageError(str(error)) from None


def serve(run: Run, bundle, sessions: int):
    """``bundle`` (resolved) served here for the run, holding ``sessions``, from SERVER_PROCESSES processes beside
    this one (0: a thread), with the run's reward and toolsets; the train split's ``AgentEnv``."""
    from agentenv_nb import AgentEnv

    return AgentEnv.local(bundle, split="train", max_concurrent_envs=sessions, processes=run.server_processes,
                          reward=run.reward or None, toolsets=run.toolsets)
