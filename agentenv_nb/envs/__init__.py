"""Envs: where a bundle's envs run and how its tasks are served. ``choice`` picks the sandbox (Docker, Modal with
``modal_credentials``, or the kit's ``process`` sandbox: plain-Python envs as local processes, in the private
``workdir``). ``resolve`` resolves a bundle once for serving; ``app`` builds its OpenEnv server behind the ``guard``
(token, origin, routes, idle sessions), keeping episodes in its ``store``; ``serve`` runs it: on a
thread (``serve.thread``), from server processes (``serve.processes``), or as the command (``serve.command``,
``python -m agentenv_nb.envs.serve``)."""

import sys

# The server's MCP stack imports jsonschema, which builds rfc3987_syntax's IRI grammar at import, where that optional
# package is installed (Jupyter's jsonschema[format-nongpl] brings it): 3 CPU-seconds in every server process and
# env parent, for format checks nothing here makes. Marked absent, jsonschema leaves the IRI formats unchecked.
sys.modules.setdefault("rfc3987_syntax", None)
