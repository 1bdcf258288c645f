"""``python -m agentenv_nb.envs.serve BUNDLE``: serve a bundle's tasks for trainers on other hosts.

    python -m agentenv_nb.envs.serve bundles/gridsim-tiny --sandbox process --max-concurrent-envs 32
    python -m agentenv_nb.envs.serve bundles/gridsim-tiny --host 0.0.0.0   # prints a token: AgentEnv(url, token=...)

It listens on 127.0.0.1 unless told otherwise (--host, AGENTENV_NB_HOST). Beyond loopback it requires an access
token: AGENTENV_NB_TOKEN's, else one made now and printed once; on loopback only when AGENTENV_NB_TOKEN is set. A
bundle is a folder, a name bundles.txt lists (fetched into ``--bundle-dir``) or an installed bundle's name, resolved
once (``envs.resolve``). Defaults come from AGENTENV_NB_HOST, AGENTENV_NB_PORT, AGENTENV_NB_SANDBOX and
AGENTENV_NB_MAX_CONCURRENT_ENVS when set (``agentenv_nb.settings``); bad input is one line and exit status 2.
SIGINT and SIGTERM stop it quietly, tearing down open episodes and removing what it made.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable

from agentenv_nb import settings
from agentenv_nb.tasks.bundles import BUNDLES_DIR, UnknownBundle


class _Parser(argparse.ArgumentParser):
    """A usage error as one line on stderr and exit status 2, as argparse's own, without the usage (``--help``)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def _setting(name: str) -> Callable[[str], object]:
    """An argparse type reading a flag's value as ``settings`` reads the setting's variable, range included."""
    def parse(text: str):
        try:
            return settings.parse(name, text, "--" + name.replace("_", "-"))
        except settings.SettingError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one, so only this machine reaches it."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))


def _default(name: str) -> str:
    """Where a flag's default comes from, as its help says it: the setting's variable, else its default."""
    setting = settings.SETTINGS[name]
    return f"default {setting.variable}, else {'chosen for the bundle' if setting.default is None else setting.default}"


def _parser() -> _Parser:
    parser = _Parser(prog="python -m agentenv_nb.envs.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", nargs="?",
                        help="a bundle folder, a name bundles.txt lists, or an installed bundle's name")
    parser.add_argument("--host", type=_setting("host"),
                        help=f"the address to listen on ({_default('host')}; beyond loopback a token is required)")
    parser.add_argument("--port", type=_setting("port"), help=f"{_default('port')}; 0: any free one")
    parser.add_argument("--sandbox", help="where episodes deploy their envs, as agent-env run --sandbox (process, "
                        f"modal, local: Docker); {_default('sandbox')}")
    parser.add_argument("--max-concurrent-envs", type=_setting("max_concurrent_envs"),
                        help="sessions served at once: one per rollout in flight, train and eval "
                        f"({_default('max_concurrent_envs')})")
    parser.add_argument("--reward", help="for tasks that record several scores: the step id whose score is the "
                        "reward, or 'mean', 'min' or 'max' of the scores")
    parser.add_argument("--bundle-dir", default=BUNDLES_DIR,
                        help="where a bundle bundles.txt lists is fetched to (default %(default)s)")
    parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)  # serve.processes: a socket it bound for us
    parser.add_argument("--resolved", help=argparse.SUPPRESS)  # serve.processes: the bundle it resolved
    parser.add_argument("--reward-file", help=argparse.SUPPRESS)  # serve.processes: the reward, in its private folder
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.bundle is None and args.resolved is None:
        parser.error("the following arguments are required: bundle")
    # A bad setting or bundle is said before the server's libraries load, which takes seconds.
    try:
        settings.check_environment()
        host, port = settings.get("host", args.host), settings.get("port", args.port)
        token = settings.get("token")
    except settings.SettingError as e:
        parser.error(str(e))
    shown = None
    if token is None and args.fd is None and not is_loopback(host):
        from agentenv_nb.envs.serve.thread import new_token

        token = shown = new_token()
    from agentenv_nb.envs.choice import SandboxError
    from agentenv_nb.envs.resolve import Resolved, resolve
    from agentenv_nb.envs.store import use_private_store

    try:
        use_private_store()  # first: agent_env reads where its store is as it loads
        resolved = (Resolved.from_json(args.resolved) if args.resolved else
                    resolve(args.bundle, args.sandbox, args.max_concurrent_envs, args.bundle_dir))
        # Its sessions hold one process of an env each: more kept ready than it holds sessions would only idle.
        os.environ[settings.SETTINGS["env_pool"].variable] = str(
            min(settings.get("env_pool"), resolved.max_concurrent_envs))
        from agentenv_nb.envs.app import build

        reward = args.reward
        if args.reward_file:
            from agentenv_nb.envs.rewards import unpickled

            with open(args.reward_file, "rb") as pickled:
                reward = unpickled(pickled.read())
        app = build(resolved, reward=reward, token=token)
    except (UnknownBundle, OSError, ValueError, SandboxError, RuntimeError) as e:
        # OSError: a bundle the Hub couldn't give, a work dir another user could change; ValueError: an env a
        # process can't run, a bundle agent_env refuses; RuntimeError: an env that didn't start
        parser.error(str(e))
    # uvicorn shuts down gracefully on SIGINT and SIGTERM, then raises the signal again, which would print a
    # KeyboardInterrupt or skip the exit hooks that remove the env processes' folders and images: exit normally.
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, lambda *_: sys.exit(0))
    if args.fd is not None:
        _serve_inherited(app, args.fd)
        return
    import uvicorn

    from agentenv_nb.envs.serve.thread import SHUTDOWN_GRACE_S

    if shown:
        print(f"agentenv_nb: serving on http://{host}:{port} with the access token {shown} (shown once: pass it as "
              "AgentEnv(url, token=...) or AGENTENV_NB_TOKEN; set AGENTENV_NB_TOKEN to choose it)", flush=True)
    uvicorn.run(app, host=host, port=port, ws_ping_interval=None, timeout_graceful_shutdown=SHUTDOWN_GRACE_S)


def _serve_inherited(app, fd: int) -> None:
    """Serve ``app`` on the listening socket ``fd`` a parent handed over, until it closes this process's stdin."""
    import uvicorn

    from agentenv_nb.envs.serve.thread import SHUTDOWN_GRACE_S

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_ping_interval=None,
                                           timeout_graceful_shutdown=SHUTDOWN_GRACE_S))

    def stop_with_parent() -> None:
        while os.read(0, 4096):  # os.read: a daemon thread inside sys.stdin's reader would abort the exit
            pass
        server.should_exit = True

    threading.Thread(target=stop_with_parent, daemon=True).start()
    server.run(sockets=[socket.socket(fileno=fd)])
