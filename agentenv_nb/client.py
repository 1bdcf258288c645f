"""``AgentEnv``: a bundle's tasks, served by ``agent_env.openenv.build_app``, as what TRL 1.15's GRPOTrainer takes:
a dataset whose rows are tasks, and an ``environment_factory`` whose environments play them on the server.

    env = AgentEnv.local("bundles/gridsim-tiny", split="train", sandbox="process", max_concurrent_envs=16)
    env.check(tokenizer)                          # tools, chat template and rows, before any step
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(...),
                          train_dataset=env.dataset, eval_dataset=env.dataset_for("eval"),
                          environment_factory=env.factory, reward_funcs=env.reward_funcs, callbacks=[env.metrics])
    trainer.train()
    env.close()                                   # or `with AgentEnv.local(...) as env:`

``AgentEnv("http://env-host:8000")`` plays a server another host runs (``python -m agentenv_nb.serve``), and
``AgentEnv([url, url2, ...])`` several servers of one bundle, spreading the sessions over them.

How TRL drives an environment: it makes one per rollout in flight and reuses it, rollout after rollout, so each holds
one session (``session.Session``). ``reset(**row)`` starts the row's task in the background and returns None, so
the model writes its first reply while the server deploys; a tool call waits for it. TRL runs tool calls one at a
time, catching an exception as the tool's result (``{"error": ...}``), and then calls ``get_reward()`` on each
environment; the first call ends every open episode at once, with an empty reply, or the model's plain-text one.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, Literal

import httpx

from .environment import Environment
from .serve import close_at_exit
from .session import Session, SessionError
from .tools import tool_method

logger = logging.getLogger(__name__)

Reward = str | Callable[[dict[str, float]], float] | None


def _setting(name: str, given: float | None, default: float) -> float:
    return float(given if given is not None else os.environ.get(f"AGENTENV_NB_{name.upper()}", default))


class AgentEnv:
    """The tasks of the split ``split`` a server at ``url`` serves, and the environments that play them. ``url``
    may be a list of servers of the same bundle: each new environment's session goes to the next.

    ``reward`` makes the reward of a task's scores here, a step id or a function of the scores by step id; without
    it the server's reward stands. ``reset_timeout`` (300 s), ``call_timeout`` (120 s) and ``patience`` (4 s) bound
    every wait (AGENTENV_NB_RESET_TIMEOUT, ..._CALL_TIMEOUT, ..._PATIENCE set their defaults). ``toolsets="each"``
    plays every task once to learn its tools, for a bundle whose tasks differ in them; by default the first task's
    are every task's. ``plain_text_replies`` passes the model's last plain-text reply to a turn it never ended, with
    ``reward_funcs=env.reward_funcs`` given to the trainer."""

    def __init__(self, url: str | list[str], split: str = "train", reward: Reward = None,
                 reset_timeout: float | None = None, call_timeout: float | None = None, patience: float | None = None,
                 toolsets: Literal["first", "each"] = "first", plain_text_replies: bool = False):
        self.urls = [u.rstrip("/") for u in ([url] if isinstance(url, str) else url)]
        self.url, self.split, self.reward, self.toolsets = self.urls[0], split, reward, toolsets
        self.plain_text_replies = plain_text_replies
        self.timeouts = {"reset_timeout": _setting("reset_timeout", reset_timeout, 300.0),
                         "call_timeout": _setting("call_timeout", call_timeout, 120.0),
                         "patience": _setting("patience", patience, 4.0)}
        self._server = None
        self._http = httpx.Client(base_url=self.url, timeout=self.timeouts["call_timeout"], trust_env=False)
        self.name: str = self._get("list_environments")[0]
        self.splits: list[str] = [split["name"] for split in self._get(f"{self.name}/splits")]
        self._tasks: dict[str, list[dict[str, Any]]] = {}
        self._environments: list[Environment] = []
        self._turns = itertools.count()
        self._metrics = None
        self._warned: set[str] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentenv_nb.client", daemon=True)
        self._thread.start()
        close_at_exit(self.close)

    @classmethod
    def local(cls, bundle, split: str = "train", sandbox: str | None = None, max_concurrent_envs: int = 8,
              reward: Reward = None, processes: int = 0, **options) -> AgentEnv:
        """Serve ``bundle`` here and play it: on a thread of this process (``processes=0``), or from ``processes``
        server processes beside it (``serve.serve_in_processes``), which keep the server's work off the trainer's
        GIL, for a GPU run. Closing the AgentEnv, leaving its ``with`` block, or the process's exit stops the
        servers. ``reward`` goes to the server, which checks at start that it scores every task."""
        from .serve import serve_in_processes, serve_in_thread

        serving = {"sandbox": sandbox, "max_concurrent_envs": max_concurrent_envs, "reward": reward}
        server = serve_in_processes(bundle, processes, **serving) if processes else serve_in_thread(bundle, **serving)
        try:
            env = cls(server.urls, split=split, **options)
        except BaseException:
            server.close()
            raise
        env._server = server
        return env

    # What the trainer takes

    @property
    def dataset(self):
        """The split's tasks, a row a task (see ``dataset_for``)."""
        return self.dataset_for(self.split)

    def dataset_for(self, split: str):
        """A ``datasets.Dataset`` of ``split``'s tasks: ``prompt`` (the task's system prompt and prompt as chat
        messages), ``split``, ``index``, ``task_id``, and ``environment``, the factory TRL routes the row to."""
        from datasets import Dataset

        return Dataset.from_list([{
            "prompt": ([{"role": "system", "content": task["system_prompt"]}] if task.get("system_prompt") else [])
            + [{"role": "user", "content": task["prompt"]}],
            "split": split, "index": task["index"], "task_id": task["id"], "environment": self._environment_of(task),
        } for task in self.tasks(split)])

    @property
    def factory(self) -> type[Environment] | dict[str, type[Environment]]:
        """TRL's ``environment_factory``: the environment class, or a dict of them when tasks differ in tools."""
        classes = self.factories
        return next(iter(classes.values())) if len(classes) == 1 else classes

    @property
    def factories(self) -> dict[str, type[Environment]]:
        """Every environment class by the name rows route by; merge two AgentEnvs' to mix their datasets."""
        return self._toolsets[0]

    @property
    def reward_funcs(self) -> list[Callable]:
        """The reward functions to give the trainer besides the environments' own: the plain-text reader when
        ``plain_text_replies`` is on."""
        from .trainer_hooks import read_plain_text_replies

        return [read_plain_text_replies] if self.plain_text_replies else []

    @property
    def metrics(self):
        """The TrainerCallback logging each task score (``trainer_hooks.ScoreLog``): ``callbacks=[env.metrics]``."""
        if self._metrics is None:
            from .trainer_hooks import ScoreLog

            self._metrics = ScoreLog()
        return self._metrics

    def check(self, tokenizer, dataset=None) -> None:
        """Check the tools, the chat template and the rows before training (``checks.check``); raises saying what
        to fix."""
        from .checks import check

        check(self.factories, tokenizer, self.dataset if dataset is None else dataset)

    # The server's tasks

    def tasks(self, split: str) -> list[dict[str, Any]]:
        """``split``'s tasks as the server describes them: id, name, index, prompt, system_prompt."""
        if split not in self.splits:
            raise ValueError(f"{self.url} serves no split {split!r}; it serves {', '.join(self.splits)} (a split per "
                             "eval of the bundle, and 'all')")
        if split not in self._tasks:
            response = self._http.post(f"/{self.name}/task_range", json={"split": split, "start": 0, "stop": None})
            response.raise_for_status()
            self._tasks[split] = response.json()["tasks"]
        return self._tasks[split]

    def _get(self, path: str) -> Any:
        try:
            response = self._http.get(f"/{path}")
        except httpx.TransportError as e:
            raise ConnectionError(f"no OpenEnv server answers at {self.url}: {e}; start one with "
                                  "`python -m agentenv_nb.serve BUNDLE`, or use AgentEnv.local(BUNDLE)") from None
        response.raise_for_status()
        return response.json()

    def _environment_of(self, task: dict[str, Any]) -> str:
        return self._toolsets[1][task["id"]] if self.toolsets == "each" else self.name

    @functools.cached_property
    def _toolsets(self) -> tuple[dict[str, type[Environment]], dict[str, str]]:
        """A class per toolset, and each probed task's class by task id: the first task's tools are every task's,
        or each task's own (``toolsets="each"``)."""
        split = "all" if self.toolsets == "each" else self.split
        tasks = self.tasks(split) if self.toolsets == "each" else self.tasks(split)[:1]
        toolsets = self.run(_gather([self._probe(split, task["index"]) for task in tasks], limit=4),
                            len(tasks) * Session(self.url, **self.timeouts).reset_bound, "probing the tasks' tools")
        groups: dict[str, tuple[str, list[dict[str, Any]], list[str]]] = {}
        for task, tools in zip(tasks, toolsets, strict=True):
            groups.setdefault(json.dumps(tools, sort_keys=True), (task["name"], tools, []))[2].append(task["id"])
        classes, class_of = {}, {}
        for first, tools, task_ids in groups.values():
            name = self.name if len(groups) == 1 else f"{self.name}/{first}"
            classes[name] = self._make_class(name, tools)
            class_of.update(dict.fromkeys(task_ids, name))
        return classes, class_of

    def _make_class(self, name: str, tools: list[dict[str, Any]]) -> type[Environment]:
        methods = {tool["name"]: tool_method(tool) for tool in tools
                   if not tool["name"].startswith("_") and tool["name"] not in ("reset", "get_reward")}
        return type(name, (Environment,), {**methods, "_agent": self, "_tools": tuple(tools), "__module__": __name__,
                                           "__qualname__": name})

    async def _probe(self, split: str, index: int) -> list[dict[str, Any]]:
        """The tools task ``index`` of ``split`` offers in its first turn: one episode, started and abandoned."""
        session = Session(self.url, **self.timeouts)
        try:
            await session.open()
            started = await session.reset(split, index)
            if started.get("done"):
                raise RuntimeError(f"task {index} of split {split!r} can't start, so its tools are unknown: "
                                   f"{(started.get('metadata') or {}).get('error')}")
            return (await session.step({"type": "list_tools"}))["observation"]["tools"]
        finally:
            await session.close()

    # Running and ending

    def run(self, coroutine: Coroutine, bound: float, what: str) -> Any:
        """Run ``coroutine`` on the sessions' event loop and wait for it, at most ``bound`` seconds."""
        return self.wait(self.submit(coroutine), bound, what)

    def wait(self, future: Future, bound: float, what: str) -> Any:
        """The result of ``future``, waiting at most ``bound`` seconds."""
        try:
            return future.result(bound)
        except TimeoutError:
            future.cancel()
            raise SessionError(f"{what}: no answer within {bound:g}s") from None

    def submit(self, coroutine: Coroutine) -> Future:
        """Start ``coroutine`` on the sessions' event loop."""
        if not self._loop.is_running():
            coroutine.close()
            raise RuntimeError(f"this AgentEnv on {self.url} is closed; make another")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def next_url(self) -> str:
        """The server the next environment's session goes to: each in turn."""
        return self.urls[next(self._turns) % len(self.urls)]

    def warn_once(self, message: str) -> None:
        """Log ``message`` as a warning the first time only: it would repeat every rollout."""
        if message not in self._warned:
            self._warned.add(message)
            logger.warning("%s", message)

    def _finish_episodes(self) -> None:
        """End every environment's open episode, all at once: TRL then reads their rewards one by one."""
        for environment in self._environments:
            episode = environment._episode
            if episode is not None and episode.finished is None:
                episode.finished = self.submit(environment._finish(episode))

    def close(self) -> None:
        """Close every session, then stop the loop and, for ``local``, the server."""
        if self._loop.is_running():
            sessions = [environment._session.close() for environment in self._environments]
            try:
                self.run(_gather(sessions), 2 * self.timeouts["patience"], "closing the sessions")
            except SessionError as e:
                logger.warning("%s", e)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(self.timeouts["patience"])
            if not self._thread.is_alive():
                self._loop.close()
        self._http.close()
        if self._server is not None:
            self._server.close()

    def __enter__(self) -> AgentEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _gather(coroutines: list[Coroutine], limit: int | None = None) -> list[Any]:
    """Run ``coroutines`` at once, at most ``limit`` at a time."""
    gate = asyncio.Semaphore(limit or len(coroutines) or 1)

    async def gated(coroutine: Coroutine) -> Any:
        async with gate:
            return await coroutine

    return await asyncio.gather(*map(gated, coroutines))
