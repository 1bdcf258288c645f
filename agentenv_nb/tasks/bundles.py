"""The bundles the kit knows (``bundles.txt``): fetch one by name, from the Hugging Face Hub or generated
offline, and describe its tasks as a table.

    from agentenv_nb.tasks import bundles
    path = bundles.get_bundle("gridsim-tiny")      # or "gridsim-v1" from the Hub
    bundles.describe(path)                          # a pandas DataFrame, a row a task
    bundles.toolset_count(path, "each")             # at most how many toolsets its tasks offer
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agentenv_nb import settings
from agentenv_nb.stops import Stop

if TYPE_CHECKING:
    import pandas as pd

HF_PREFIX = "hf-dataset:"
BUNDLES_DIR = "bundles"  # where a bundle bundles.txt lists is fetched or generated, unless told


@dataclass(frozen=True)
class BundleSource:
    """One line of bundles.txt: where the bundle ``name`` comes from."""

    name: str
    source: str
    what: str

    def fetch(self, root: Path) -> Path:
        """The bundle's folder under ``root``, downloaded or generated unless it's already there."""
        if self.source.startswith(HF_PREFIX):
            return _download(self.source.removeprefix(HF_PREFIX), self.what, root)
        if self.source == "gridsim":
            from agentenv_nb.tasks.gridsim import write_bundle

            folder = root / self.name
            if (folder / "tasks").is_dir():
                return folder
            settings = dict(part.split("=", 1) for part in self.what.split())
            return write_bundle(folder, **{key: int(value) for key, value in settings.items()})
        raise ValueError(f"bundles.txt: {self.name} has source {self.source!r}; use {HF_PREFIX}<repo> or gridsim")


def known_bundles(listing: str | Path | None = None) -> dict[str, BundleSource]:
    """The bundles ``listing`` (default: AGENTENV_NB_BUNDLES, else the repository's bundles.txt) names, by name."""
    text = Path(listing or settings.get("bundles")).read_text()
    rows = (line.split(maxsplit=2) for line in text.splitlines() if line.strip()[:1] not in ("", "#"))
    return {row[0]: BundleSource(*row) for row in rows}


class UnknownBundle(Stop, KeyError):
    """A name that is no bundle folder, no bundle of bundles.txt and no installed bundle; the message lists them."""

    def __str__(self) -> str:
        return self.args[0]  # as written, not quoted as a KeyError's key is


def get_bundle(name: str | Path, root: str | Path = BUNDLES_DIR) -> Path:
    """The folder of the bundle ``name``: a folder path, one of bundles.txt's (fetched into ``root``), or a bundle
    a package installs (``agent-env run`` lists them, e.g. agent_env's example ``mail-mcp``)."""
    if Path(name).is_dir():
        return Path(name)
    known = known_bundles()
    if str(name) in known:
        return known[str(name)].fetch(Path(root))
    from agent_env.bundle.installed import find_bundle, path_like
    from agent_env.bundle.parse import BundleError

    if not path_like(str(name)):
        try:
            return find_bundle(str(name)).root
        except BundleError:
            pass
    # a notebook runs in notebooks/, not where a user wrote their bundle: say where a relative path was looked for
    where = "" if Path(name).is_absolute() else f" in {Path.cwd()}"
    raise UnknownBundle(f"no bundle {str(name)!r}: no such folder{where}, and bundles.txt knows {', '.join(known)}; "
                        "pass one of those, a bundle folder's absolute path, or an installed bundle's name (agent-env "
                        "run lists them)")


def _download(repo_id: str, folder: str, root: Path) -> Path:
    """``folder`` of the Hub dataset ``repo_id`` under ``root``, with a progress bar; clear errors when the Hub
    can't be reached, refuses access, or has no such repo or folder."""
    import httpx
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        HfApi().dataset_info(repo_id)  # fails fast and plainly: no network, no access, no such dataset
        snapshot_download(repo_id, repo_type="dataset", allow_patterns=[f"{folder}/*"], local_dir=root)
    except GatedRepoError as e:
        raise PermissionError(f"{repo_id} is gated: accept its terms on the Hub, then set HF_TOKEN (Colab: a "
                              "secret named HF_TOKEN) or run `hf auth login`") from e
    except RepositoryNotFoundError as e:
        raise PermissionError(f"the Hub has no dataset {repo_id} you can read: check the name in bundles.txt, or "
                              "set HF_TOKEN if it's private") from e
    except (LocalEntryNotFoundError, HfHubHTTPError, httpx.HTTPError, OSError) as e:
        raise ConnectionError(f"couldn't download {repo_id} from the Hugging Face Hub ({e.__class__.__name__}: "
                              f"{e}); check the network, or generate GridSim offline: "
                              "get_bundle('gridsim-offline')") from e
    path = root / folder
    if not (path / "tasks").is_dir():
        raise FileNotFoundError(f"{repo_id} has no bundle at {folder}/ (no tasks/ there); check bundles.txt")
    return path


def describe(bundle: str | Path) -> pd.DataFrame:
    """A row a task of ``bundle``: its name, the evals (splits) holding it, its prompt, and what it deploys,
    loads and verifies, as agent-env parses the folder."""
    import pandas as pd
    from agent_env.bundle import parse_bundle
    from agent_env.bundle.parse import BundleKind

    parsed = parse_bundle(Path(bundle))
    splits: dict[str, list[str]] = {}
    for entry in parsed.entries:
        if entry.kind is BundleKind.EVAL:
            for task in tomllib.loads(entry.path.read_text())["tasks"]:
                splits.setdefault(task, []).append(entry.name)
    rows = []
    for entry in parsed.entries:
        if entry.kind is not BundleKind.TASK:
            continue
        steps = entry.config
        of = lambda kind, key: ", ".join(str(s.get(key)) for s in steps if s.get("type") == kind)  # noqa: E731
        rows.append({"task": entry.name, "splits": ", ".join(splits.get(entry.name, [])),
                     "prompt": of("prompt_agent", "prompt"), "envs": of("deploy_env", "env_id"),
                     "loads": of("load_artifact", "artifact_id"),
                     "verifiers": ", ".join(str(s.get("verifier_id")) for s in steps if "verifier" in s.get("type", ""))})
    return pd.DataFrame(rows)


def toolset_count(bundle: str | Path, toolsets: str = "first") -> int:
    """How many environment classes an ``AgentEnv`` of ``bundle`` makes, at most, before it is served: 1 with
    ``toolsets="first"``; with ``"each"``, the distinct sets of envs its tasks deploy (tasks deploying the same envs
    offer the same tools). The env servers are sized from it: TRL keeps a pool of environments per class."""
    if toolsets != "each":
        return 1
    return max(1, describe(bundle)["envs"].nunique())
