"""Where a serving process keeps agent_env's store of episodes (its SQLite documents and objects under
``$XDG_STATE_HOME/agent-env``): AGENTENV_NB_STORE, else a folder of the process's own in the work dir, removed when
it exits (or swept by a later server, if it was killed). Never ``~/.local/state/agent-env``, agent_env's default,
which outlives every run and holds every episode ever played there.

    use_private_store()   # once a process, before its first server builds its app
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading

from agentenv_nb import settings

_chosen: list[str] = []  # the folder this process's servers keep their store in, once chosen
_lock = threading.Lock()


def use_private_store() -> str:
    """Point agent_env's store at AGENTENV_NB_STORE or a private folder, the first time in a process; the folder."""
    with _lock:
        if not _chosen:
            _chosen.append(settings.get("store") or _own_folder())
            os.environ["XDG_STATE_HOME"] = _chosen[0]
            if "agent_env.config" in sys.modules:  # agent_env read the old place already (resolving the bundle)
                from agent_env.config import reset_config

                reset_config()
        return _chosen[0]


def _own_folder() -> str:
    from agentenv_nb.envs.workdir import owned_prefix, work_dir
    from agentenv_nb.lifecycle import close_at_exit

    folder = tempfile.mkdtemp(prefix=owned_prefix("store"), dir=work_dir())
    close_at_exit(lambda: shutil.rmtree(folder, ignore_errors=True))
    return folder
