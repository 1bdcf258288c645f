"""One TLS context for every httpx client of the server's process that asks for the default one.

httpx builds and parses the CA bundle for each client it makes (encode/httpx#3473), and agent_env makes a client for
each request: an open episode polls its turn ten times a second, so a few open episodes keep the server's CPU busy
before any tool runs (what it cost: docs/benchmarks.md, "Tool calls at full concurrency"). Sharing the default
context changes nothing a client verifies.

    share_default_context()   # once, in the process that serves agent_env
"""

from __future__ import annotations

import functools
import os

import httpx


def share_default_context() -> None:
    """Make httpx's transports reuse one default context (per trust_env and CA settings) instead of a new one each."""
    for transport in (httpx.HTTPTransport, httpx.AsyncHTTPTransport):
        if not getattr(transport.__init__, "shares_default_context", False):
            transport.__init__ = _sharing(transport.__init__)


def _sharing(init):
    @functools.wraps(init)
    def shared(self, verify=True, cert=None, trust_env=True, *args, **kwargs):
        if verify is True and cert is None:  # only the default: a client's own context or certificate stays its own
            variables = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")) if trust_env else None
            verify = default_context(trust_env, variables)
        init(self, verify, cert, trust_env, *args, **kwargs)

    shared.shares_default_context = True
    return shared


@functools.lru_cache(maxsize=4)
def default_context(trust_env: bool, variables: tuple | None):
    """httpx's default context for these settings (``variables``: the CA variables it reads), made once."""
    return httpx.create_ssl_context(verify=True, trust_env=trust_env)
