"""A bundle resolved once for serving: its folder, where its envs run and how many sessions it serves. Every way of
serving takes a ``Resolved`` and hands it down; server processes get it as JSON instead of checking again.

    resolved = resolve("gridsim-tiny", sandbox="process", max_concurrent_envs=16)
    serve_in_thread(resolved)        # or AgentEnv.local(resolved, ...), serve_in_processes(resolved, 4)

Resolving checks every env the process sandbox would run, its requirements included, and starts each once (once a
process, until one of its files changes), so a bad env (a Dockerfile line, a missing package, an import that raises)
stops the start, not every episode. ``max_concurrent_envs`` unset is AGENTENV_NB_MAX_CONCURRENT_ENVS, else its
default (``settings``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from agentenv_nb import settings
from agentenv_nb.tasks.bundles import BUNDLES_DIR, get_bundle


@dataclass(frozen=True)
class Resolved:
    """What a server serves: the bundle's folder, the sandbox chosen (its name and why) and its session limit."""

    folder: Path
    sandbox: str
    reason: str
    max_concurrent_envs: int

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "folder": str(self.folder)})

    @classmethod
    def from_json(cls, text: str) -> Resolved:
        fields = json.loads(text)
        return cls(**{**fields, "folder": Path(fields["folder"])})


def resolve(bundle: str | Path | Resolved, sandbox: str | None = None, max_concurrent_envs: int | None = None,
            bundle_dir: str | Path = BUNDLES_DIR) -> Resolved:
    """``bundle`` (a folder, a name ``bundles.txt`` lists, an installed bundle) resolved: fetched, its sandbox chosen
    (``choice.choose_sandbox``; ``sandbox`` forces one, ``"auto"`` none) and, for the process sandbox, every env
    checked. A ``Resolved`` is returned as it is, holding ``max_concurrent_envs`` sessions where that is given."""
    if isinstance(bundle, Resolved):
        if max_concurrent_envs is None:
            return bundle
        return replace(bundle, max_concurrent_envs=settings.get("max_concurrent_envs", max_concurrent_envs))
    from agentenv_nb.envs.process import sandbox as process_sandbox
    from agentenv_nb.envs.choice import AUTO, DOCKER, PROCESS, choose_sandbox

    settings.check_environment()  # a bad setting is said before the bundle is fetched or anything starts
    limit = settings.get("max_concurrent_envs", max_concurrent_envs)
    folder = get_bundle(bundle, bundle_dir)
    # Said unless the caller named it: a choice made here, or Docker, which may not answer (its reason says so).
    choice = choose_sandbox(folder, force=sandbox, echo=sandbox in (None, AUTO, DOCKER))
    if choice.name == PROCESS:
        process_sandbox.trial(folder)  # an env that can't start stops this start, not every episode
    return Resolved(Path(folder), choice.name, choice.reason, limit)
