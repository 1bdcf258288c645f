"""Envs: where a bundle's envs run and how its tasks are served. ``choice`` picks the sandbox (Docker, Modal with
``modal_credentials``, or the kit's ``process_sandbox``: plain-Python envs as local processes, read from their
``image``, kept ready in a ``pool``, each set up by ``zygote`` in the private ``workdir``, their deaths told by
``deaths``). ``resolve`` resolves a bundle once for serving; ``app`` builds its OpenEnv server behind the ``guard``
(token, origin, routes, idle sessions); ``serving`` runs it on a thread, ``processes`` from server processes, and
``agentenv_nb.serve`` is the command."""

import sys

# The server's MCP stack imports jsonschema, which builds rfc3987_syntax's IRI grammar at import, where that optional
# package is installed (Jupyter's jsonschema[format-nongpl] brings it): 3 CPU-seconds in every server process and
# env parent, for format checks nothing here makes. Marked absent, jsonschema leaves the IRI formats unchecked.
sys.modules.setdefault("rfc3987_syntax", None)
