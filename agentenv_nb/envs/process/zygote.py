"""The env-side of a process sandbox: turn this process (or a fork of it) into one env's MCP server.

Run as a script, so nothing of the package is imported into the env (the package imports it for its marks and
``outside_imports``)::

    python zygote.py run < '<process json>'   # become the env: a fresh interpreter, as `python server.py` is
    python zygote.py fork '<module list>' EXITS  # import the modules once, then fork a child per line on stdin

A process json holds ``app_dir``, ``script``, ``args``, ``env`` (its whole environment), ``port``, ``root`` (the
process's own folder: its ``log`` takes the output, and ``ready`` appears once it listens), ``private``: the folders
under ``root`` (``data``, ``tmp``) to mount at ``/data`` and ``/tmp`` in a mount namespace of its own, so a file staged
for it, or its sqlite in /tmp, is its alone; ``reads``: what it reads besides its app (bound back where it lies under
/tmp, and revealed on the way through folders others can't enter); ``ids``: the user and group ids to run as (a server running as root
gives each process a user id of its own), or None; and ``secret``: what its port requires. Every request to the env's
server must carry it as Basic auth (user ``SECRET_USER``), or gets 401: a guard wraps the app uvicorn loads, and the
process is marked ready only once its server is guarded, so another local process (another episode's env among them)
can't call it. This relies on uvicorn's ``Config.load`` setting ``Config.loaded_app`` (a test fails when that
changes). A forked child answers ``{"pid": ...}``; it has a session of its own, so killing its group kills
all it started, and it dies with the forking parent. The parent kills its children, removes their folders and exits
when its stdin closes, as it does when the server dies.
"""

import ast
import ctypes
import json
import logging
import os
import runpy
import select
import shutil
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from pathlib import Path

import psutil

_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x20000, 4096, 16384, 1 << 18
_PR_SET_PDEATHSIG = 1
PRIVATE_MARK = "private"  # written in root once /data (and /tmp) are the process's own
READY_MARK = "ready"  # written in root once the server listens
SECRET_USER = "agentenv"
_guarded = threading.Event()  # set once the env's server app is wrapped in the secret's guard


def become(process: dict) -> None:
    """Run the env's script as ``__main__`` in this process, set up as ``process`` says; never returns."""
    code = 0
    try:
        os.setsid()
        libc = ctypes.CDLL(None, use_errno=True)
        root = os.open(process["root"], os.O_RDONLY)
        log = os.open("log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600, dir_fd=root)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        if process["private"]:
            _private(libc, process["root"], process["private"], process["reads"])
            os.close(os.open(PRIVATE_MARK, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=root))
        if process["ids"]:
            _reveal(libc, process["reads"])
            uid, gid = process["ids"]
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # after the ids change, which clears it
        _guard_uvicorn(process["secret"])
        threading.Thread(target=_mark_ready, args=(process["port"], root), daemon=True).start()
        # Plain-text logging, set first, so a server's own basicConfig (FastMCP's renders each traceback with rich,
        # costly for the one every MCP session's close logs, while the env answers nothing) leaves it be.
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        os.environ.clear()
        os.environ.update(process["env"])
        os.environ["MCP_PORT"] = str(process["port"])
        os.chdir(process["app_dir"])
        sys.path[0] = process["app_dir"]
        sys.argv = [process["script"], *process["args"]]
        if "numpy" in sys.modules:  # random reseeds itself in a fork; numpy's global generator doesn't
            sys.modules["numpy"].random.seed()
        runpy.run_path(process["script"], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (e.code is not None)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _mark_ready(port: int, root: int) -> None:
    """Write ``READY_MARK`` in the process's folder once its own server listens on ``port``: uvicorn listens only after
    the app has started, so its card is served by then, and the parent needn't poll it over HTTP. A listener another
    process put on the port (it took the port between the parent's pick and this server's bind) doesn't count: this
    server's bind fails and the process exits, saying so, rather than the episode talking to another env."""
    while not (_accepts(port) and _listening_here(port)):  # the cheap check first, the tables once it passes
        time.sleep(0.005)
    if not _guarded.is_set():
        print("agentenv_nb: the env's server isn't uvicorn's, so its port can't require the episode's secret; the "
              "process sandbox runs only envs served by uvicorn (FastMCP, agentenv_protocol)", file=sys.stderr)
        os._exit(3)
    os.close(os.open(READY_MARK, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=root))


def _guard_uvicorn(secret: str) -> None:
    """Wrap every app uvicorn loads in this process in a guard requiring ``secret`` as Basic auth."""
    import base64
    import hmac

    import uvicorn.config

    expected = b"Basic " + base64.b64encode(f"{SECRET_USER}:{secret}".encode())
    load = uvicorn.config.Config.load

    def guarded_load(config) -> None:
        load(config)
        app = config.loaded_app

        async def guarded(scope, receive, send):
            if scope["type"] in ("http", "websocket") and not hmac.compare_digest(
                    dict(scope.get("headers") or []).get(b"authorization", b""), expected):
                if scope["type"] == "websocket":
                    return await send({"type": "websocket.close", "code": 1008})
                await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"0")]})
                return await send({"type": "http.response.body", "body": b""})
            return await app(scope, receive, send)

        config.loaded_app = guarded
        _guarded.set()

    uvicorn.config.Config.load = guarded_load


def _accepts(port: int) -> bool:
    """Whether something accepts connections on loopback ``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _listening_here(port: int) -> bool:
    """Whether a process of this env's process group (this one, or a server it started) listens on TCP ``port``."""
    if any(_listens(c, port) for c in _sockets(psutil.Process())):  # as usual: the script serves in this process
        return True
    try:  # every listener with its process: costlier than this process's own sockets, so second
        owners = {c.pid for c in psutil.net_connections(kind="tcp") if _listens(c, port)}
    except psutil.AccessDenied:  # the tables themselves are closed to this process
        owners = {None}
    if any(_in_group(pid) for pid in owners - {None}):
        return True
    if None not in owners:  # every listener's process is known, and none is the env's
        return False
    # psutil names a socket's process only where it may read that process's descriptors (every one as root, as here
    # and on Colab); it may read the group's own, so look at their sockets.
    group = (process for process in psutil.process_iter() if _in_group(process.pid))
    return any(_listens(c, port) for process in group for c in _sockets(process))


def _listens(connection, port: int) -> bool:
    return connection.status == psutil.CONN_LISTEN and connection.laddr.port == port


def _in_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:  # gone
        return False


def _sockets(process: psutil.Process) -> list:
    try:
        return process.net_connections(kind="tcp")
    except psutil.Error:  # gone
        return []


def _private(libc, root: str, names: list, reads: list) -> None:
    """Mount ``root/<name>`` at ``/<name>`` for each name, in a mount namespace only this process (and its children)
    sees. What the process reads under /tmp (this Python in a virtual environment there, the work dir) is bound into
    its own /tmp first, at the same path, so /tmp is private wherever the kit lives."""
    def check(result: int, what: str) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "making / private")
    for name in names:
        source, target = os.path.join(root, name), f"/{name}"
        outermost = [read for read in reads if read.startswith(target + "/")
                     and not any(read.startswith(other + "/") for other in reads)]
        for read in outermost:  # bound in the folder before it covers the original: the path is the same after
            inside = source + read[len(target):]
            if os.path.isdir(read):
                os.makedirs(inside, mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(inside), mode=0o755, exist_ok=True)
                open(inside, "a").close()
            check(libc.mount(read.encode(), inside.encode(), None, _MS_BIND | _MS_REC, None), f"binding {read}")
        check(libc.mount(source.encode(), target.encode(), None, _MS_BIND | _MS_REC, None),
              f"binding {root}/{name} at /{name}")


def _reveal(libc, reads: list) -> None:
    """Let a process that will run as another user reach ``reads`` (this Python, under a 0700 /root say): each folder
    on their way that others can't enter is covered, in this mount namespace, by an empty one they can, holding only
    what is on the way, bound from the original. The rest of it (a token under /root, say) stays out of reach."""
    def check(result: int, what: str) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    on_the_way: dict[str, set] = {}
    for read in reads:
        parts = read.strip("/").split("/")
        for depth in range(1, len(parts)):
            on_the_way.setdefault("/" + "/".join(parts[:depth]), set()).add(parts[depth])
    for folder in sorted(on_the_way, key=lambda path: path.count("/")):
        if os.stat(folder).st_mode & 0o001 or folder in reads:  # others may enter it, or it is read whole
            continue
        # Held open by descriptor: once the folder is covered, its children are reached through these alone.
        held = [(child, os.open(os.path.join(folder, child), os.O_PATH)) for child in sorted(on_the_way[folder])]
        check(libc.mount(b"tmpfs", folder.encode(), b"tmpfs", 0, b"mode=0711"), f"covering {folder}")
        for child, fd in held:
            target = os.path.join(folder, child)
            os.mkdir(target) if stat.S_ISDIR(os.fstat(fd).st_mode) else open(target, "w").close()
            check(libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, _MS_BIND | _MS_REC, None),
                  f"revealing {target}")
            os.close(fd)


def outside_imports(app: Path) -> tuple:
    """The top-level modules the app's Python files import that aren't its own: what a forking parent imports first
    (``EnvImage.preload``), so each fork finds them loaded."""
    local = {path.stem for path in app.glob("*.py")} | {path.name for path in app.iterdir() if path.is_dir()}
    found = set()
    for path in app.rglob("*.py"):
        try:
            tree = ast.parse(path.read_text("utf8"))
        except (SyntaxError, UnicodeDecodeError):  # not the app's to run, or not Python
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return tuple(sorted(found - local - {"__future__"}))


def serve_forks(modules: list, exits: str) -> None:
    """Import ``modules``, then fork a child per JSON line on stdin until it closes; then kill the children still
    running and remove their folders, as the server would have. As each child ends, the file ``exits/<pid>`` says
    how: its exit status, or minus the signal that killed it (outside its folder, which the server may be removing)."""
    for module in modules:
        try:
            __import__(module)
        except BaseException:  # the child imports it again and reports what fails
            pass
    children = {}

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            try:
                children.pop(pid, None)
                with open(os.path.join(exits, str(pid)), "w") as mark:
                    mark.write(str(code))
            except OSError:  # the pool is closing, and its folder with it
                pass

    # A Python handler that reaps can miss a death: one that comes just before a blocking read of stdin waits for the
    # next line, and the child stays a zombie its server takes for alive. The signal's wakeup fd wakes the select; the
    # handler does nothing but must be set, as SIGCHLD ignored by default writes nothing to the fd.
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stdin, pending = sys.stdin.fileno(), b""
    while True:
        readable, _, _ = select.select([stdin, woken], [], [])
        if woken in readable:
            os.read(woken, 4096)
            reap()
        if stdin not in readable:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            process = json.loads(line)
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(woken)
                os.close(wake)
                become(process)
            children[pid] = process["root"]
            sys.stdout.write(json.dumps({"pid": pid}) + "\n")
            sys.stdout.flush()
    for pid, root in list(children.items()):
        if os.path.isdir(root):  # the server removes the folder of each child it kills
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        become(json.loads(sys.stdin.read()))
    else:
        serve_forks(json.loads(sys.argv[2]), sys.argv[3])
