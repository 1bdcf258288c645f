"""``AgentEnv``: a bundle's tasks, served by ``agent_env.openenv.build_app``, as what TRL 1.15's GRPOTrainer takes:
a dataset whose rows are tasks, and an ``environment_factory`` whose environments play them on the server.

    env = AgentEnv.local("bundles/gridsim-tiny", split="train", sandbox="process", max_concurrent_envs=16)
    env.check(tokenizer)                          # tools, chat template and rows, before any step
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(...),
                          train_dataset=env.dataset, eval_dataset=env.dataset_for("eval"),
                          environment_factory=env.factory, reward_funcs=env.reward_funcs, callbacks=[env.metrics])
    trainer.train()
    env.close()                                   # or `with AgentEnv.local(...) as env:`

``AgentEnv("http://env-host:8000", token=...)`` plays a server another host runs (``python -m agentenv_nb.envs.serve``,
which prints its token), and ``AgentEnv([url, url2, ...])`` several servers of one bundle, spreading the sessions
over them.

How TRL drives an environment: it makes one per rollout in flight and reuses it, rollout after rollout, so each holds
one session (``client.session.Session``). ``reset(**row)`` starts the row's task in the background and returns None, so
the model writes its first reply while the server deploys; a tool call waits for it. TRL runs tool calls one at a
time (``agentenv_nb.train.grpo.trainer.GRPOTrainer`` runs a round's calls across rollouts at once), catching an
exception as the tool's result (``{"error": ...}``), then calls ``get_reward()`` on each environment; the first call
ends the open episodes its thread started at once, with an empty reply, or the model's plain-text one.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, Literal

import httpx

from agentenv_nb import settings
from agentenv_nb.client.environment import Environment, environment_class, read_plain_text_replies
from agentenv_nb.client.player import Rules
from agentenv_nb.client.runtime import Runtime, gather
from agentenv_nb.client.session import Session
from agentenv_nb.envs.rewards import Reward
from agentenv_nb.lifecycle import close_at_exit


class AgentEnv:
    """The tasks of the split ``split`` a server at ``url`` serves, and the environments that play them. ``url``
    may be a list of servers of the same bundle: each new environment's session goes to the next with room.

    ``reward`` makes the reward of a task's scores here, a step id or a function of the scores by step id; without it
    the server's reward stands. ``reset_timeout``, ``call_timeout`` and ``patience`` bound every wait, in seconds
    (unset: AGENTENV_NB_RESET_TIMEOUT, ..._CALL_TIMEOUT, ..._PATIENCE, else their defaults, ``agentenv_nb.settings``).
    ``toolsets="each"`` plays every task once to learn its tools, for a bundle whose tasks differ in them; by default
    the first task's are every task's. ``plain_text_replies`` passes the model's last plain-text reply to a turn it
    never ended, with ``reward_funcs=env.reward_funcs`` given to the trainer. ``max_concurrent_envs``: the sessions the
    servers hold together, known for ``local`` and otherwise what they were started with, if given (the preflight checks
    it against the trainer's; OpenEnv doesn't publish it). ``token``: the servers' access token (default
    AGENTENV_NB_TOKEN), sent with every request; ``local`` passes its own."""

    def __init__(self, url: str | list[str], split: str = "train", reward: Reward = None,
                 reset_timeout: float | None = None, call_timeout: float | None = None, patience: float | None = None,
                 toolsets: Literal["first", "each"] = "first", plain_text_replies: bool = False,
                 max_concurrent_envs: int | None = None, token: str | None = None):
        self.urls = [u.rstrip("/") for u in ([url] if isinstance(url, str) else url)]
        self.url, self.split, self.toolsets = self.urls[0], split, toolsets
        self.max_concurrent_envs = max_concurrent_envs
        self.timeouts = {"reset_timeout": settings.get("reset_timeout", reset_timeout),
                         "call_timeout": settings.get("call_timeout", call_timeout),
                         "patience": settings.get("patience", patience)}
        self.token = settings.get("token", token)
        self.rules = Rules(tuple(self.urls), self.timeouts, reward, plain_text_replies, toolsets, self.token)
        self.server = None  # what AgentEnv.local serves the bundle with, stopped with this AgentEnv
        self._http = httpx.Client(base_url=self.url, timeout=self.timeouts["call_timeout"], trust_env=False,
                                  headers={"Authorization": f"Bearer {self.token}"} if self.token else None)
        self.name, self.splits = describe_server(self._http, self.url)
        self._tasks: dict[str, list[dict[str, Any]]] = {}
        self._runtime = Runtime(self.name)
        close_at_exit(self.close)

    @classmethod
    def local(cls, bundle, split: str = "train", sandbox: str | None = None, max_concurrent_envs: int | None = None,
              reward: Reward = None, processes: int = 0, **options) -> AgentEnv:
        """Serve ``bundle`` (a folder, or a name as ``tasks.bundles.get_bundle`` takes) here and play it: on a thread
        of this process (``processes=0``), or from ``processes`` server processes beside it
        (``envs.serve.processes.serve_in_processes``), which keep the server's work off the trainer's GIL, for a GPU
        run.
        Without ``sandbox`` the envs run where ``envs.choice.choose_sandbox`` says; every env is checked before the
        server starts. Closing the AgentEnv, leaving its ``with`` block, or the process's exit stops the servers, and
        the env processes they started. ``reward`` goes to the server, which checks at start that it scores every
        task. ``bundle`` may be resolved already (``envs.resolve``), ``max_concurrent_envs`` then over its own;
        unset, it is AGENTENV_NB_MAX_CONCURRENT_ENVS, else its default (``agentenv_nb.settings``). The servers require
        a token made here, which this AgentEnv sends."""
        from agentenv_nb.envs.resolve import resolve
        from agentenv_nb.envs.serve.processes import serve_in_processes
        from agentenv_nb.envs.serve.thread import serve_in_thread

        resolved = resolve(bundle, sandbox, max_concurrent_envs)  # every setting is read first
        serving = {"reward": reward, "token": options.pop("token", None)}
        server = (serve_in_processes(resolved, processes, **serving) if processes else
                  serve_in_thread(resolved, **serving))
        try:
            env = cls(server.urls, split=split, max_concurrent_envs=server.max_concurrent_envs, token=server.token,
                      **options)
        except BaseException:
            server.close()
            raise
        env.server = server
        return env

    # What the trainer takes

    @property
    def dataset(self):
        """The split's tasks, a row a task (see ``dataset_for``)."""
        return self.dataset_for(self.split)

    def dataset_for(self, split: str, first: int | None = None):
        """A ``datasets.Dataset`` of ``split``'s tasks (its ``first`` ones, when given): ``prompt`` (the task's system
        prompt and prompt as chat messages), ``split``, ``index``, ``task_id``, and ``environment``, the factory TRL
        routes the row to."""
        from datasets import Dataset

        return Dataset.from_list([{
            "prompt": ([{"role": "system", "content": task["system_prompt"]}] if task.get("system_prompt") else [])
            + [{"role": "user", "content": task["prompt"]}],
            "split": split, "index": task["index"], "task_id": task["id"], "environment": self._environment_of(task),
        } for task in self.tasks(split)[:first]])

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
        return [read_plain_text_replies] if self.rules.plain_text_replies else []

    @property
    def metrics(self):
        """The TrainerCallback logging each task score (``trainer_hooks.ScoreLog``): ``callbacks=[env.metrics]``."""
        if self._runtime.metrics is None:
            from agentenv_nb.client.metrics import ScoreLog

            self._runtime.metrics = ScoreLog()
        return self._runtime.metrics

    def check(self, tokenizer, dataset=None) -> None:
        """Check the tools, the chat template and the rows before training (``checks.check``); raises saying what
        to fix."""
        from agentenv_nb.client.checks import check

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

    def _environment_of(self, task: dict[str, Any]) -> str:
        return self._toolsets[1][task["id"]] if self.toolsets == "each" else self.name

    @functools.cached_property
    def _toolsets(self) -> tuple[dict[str, type[Environment]], dict[str, str]]:
        """A class per toolset, and each probed task's class by task id: the first task's tools are every task's,
        or each task's own (``toolsets="each"``)."""
        split = "all" if self.toolsets == "each" else self.split
        tasks = self.tasks(split) if self.toolsets == "each" else self.tasks(split)[:1]
        toolsets = self._runtime.run(gather([self._probe(split, task["index"]) for task in tasks], limit=4),
                                     len(tasks) * Session(self.url, token=self.token, **self.timeouts).reset_bound,
                                     "probing the tasks' tools")
        groups: dict[str, tuple[str, list[dict[str, Any]], list[str]]] = {}
        for task, tools in zip(tasks, toolsets, strict=True):
            groups.setdefault(json.dumps(tools, sort_keys=True), (task["name"], tools, []))[2].append(task["id"])
        classes, class_of = {}, {}
        for first, tools, task_ids in groups.values():
            name = self.name if len(groups) == 1 else f"{self.name}/{first}"
            classes[name] = environment_class(name, tuple(tools), self._runtime, self.rules)
            class_of.update(dict.fromkeys(task_ids, name))
        return classes, class_of

    async def _probe(self, split: str, index: int) -> list[dict[str, Any]]:
        """The tools task ``index`` of ``split`` offers in its first turn: one episode, started and abandoned."""
        session = Session(self.url, token=self.token, **self.timeouts)
        try:
            await session.open()
            started = await session.reset(split, index)
            if started.get("done"):
                raise RuntimeError(f"task {index} of split {split!r} can't start, so its tools are unknown: "
                                   f"{(started.get('metadata') or {}).get('error')}")
            return (await session.step({"type": "list_tools"}))["observation"]["tools"]
        finally:
            await session.close()

    def close(self) -> None:
        """Close every session, then stop the loop and, for ``local``, the server."""
        self._runtime.close(self.timeouts["patience"])
        self._http.close()
        if self.server is not None:
            self.server.close()

    def __enter__(self) -> AgentEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()



def describe_server(http: httpx.Client, url: str) -> tuple[str, list[str]]:
    """The environment an OpenEnv server of agent_env serves, and its splits (OpenEnv's Task API); raises
    ConnectionError saying what to start when nothing, or something else, answers at ``url``."""
    start = "start one with `python -m agentenv_nb.envs.serve BUNDLE`, or use AgentEnv.local(BUNDLE)"
    instead = f"point AgentEnv at the URL `python -m agentenv_nb.envs.serve` prints, or {start}"
    try:
        names = http.get(f"{url}/list_environments").raise_for_status().json()
        if not (isinstance(names, list) and len(names) == 1 and isinstance(names[0], str)):
            raise ValueError(f"GET /list_environments answered {json.dumps(names)[:100]}, not one environment's name")
        [name] = names
        splits = [split["name"] for split in http.get(f"{url}/{name}/splits").raise_for_status().json()]
    except httpx.TransportError as e:
        raise ConnectionError(f"no env server answers at {url} ({type(e).__name__}: {e}); {start}") from None
    except httpx.HTTPStatusError as e:
        if e.response.status_code == 401:
            raise PermissionError(f"{url} needs its access token, which this AgentEnv "
                                  f"{'sent wrong' if 'authorization' in e.request.headers else 'lacks'}: pass "
                                  "AgentEnv(url, token=...) or set AGENTENV_NB_TOKEN (the serve command prints it once "
                                  "when it starts)") from None
        raise ConnectionError(f"{url} answers, but isn't an agent_env OpenEnv server ({e.request.method} "
                              f"{e.request.url.path} got HTTP {e.response.status_code}); {instead}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ConnectionError(f"{url} answers, but isn't an agent_env OpenEnv server (its answer doesn't read as "
                              f"one: {e}); {instead}") from None
    return name, splits
