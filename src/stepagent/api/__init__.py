"""The HTTP API for applications: authenticated send and approvals, the history, and a resumable event
stream of a thread tree (Server-Sent Events), plus a minimal chat page that uses them.

:mod:`stepagent.api.app` is the ASGI application, :mod:`stepagent.api.events` the event stream,
:mod:`stepagent.api.auth` the bearer-token checks, :mod:`stepagent.api.ownership` who owns which
conversation, :mod:`stepagent.api.server` serves it (``stepagent api``, ``stepagent run --api``) and
:mod:`stepagent.api.lambda_app` builds it from the environment for Lambda.
"""

DEFAULT_PORT = 8788
