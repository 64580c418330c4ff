"""The web console: ``stepagent console`` (and ``stepagent run --console``).

A local web application on :class:`stepagent.client.Client` — so it works on the embedded stack, on
LocalStack/moto (settings and ``AWS_ENDPOINT_URL``) and on a deployment (``--stack NAME``): the
conversations (newest first, searchable, with status and token usage), a conversation's thread tree with
each thread's history, live partial text, pending calls, questions, links, held inputs, subscriptions and
timers; sending, answering, rewinding, exporting; the dead-letter queues with redrive.

- :mod:`~stepagent.console.status` — the status rules (idle, working, waiting on a tool / a timer / a
  choice, failed), pure;
- :mod:`~stepagent.console.reads` — what a page reads, and what it costs;
- :mod:`~stepagent.console.pages` — server-rendered HTML from the Jinja2 templates in ``templates/``
  (autoescaping on: every stored text escaped);
- :mod:`~stepagent.console.app` — routes, JSON API, actions, CSRF token and loopback ``Host`` check;
- :mod:`~stepagent.console.dead_letters` — the DLQs through :mod:`stepagent.aws.dlq`;
- :mod:`~stepagent.console.server` — serving it (127.0.0.1 by default), the account in the header;
- ``static/`` — the one script (polls, submits forms in place) and the stylesheet; no build step.


Start it with :func:`stepagent.console.server.serve_console` (or ``open_console`` to serve inside a
``with``); this package's own import stays light (the CLI reads :data:`DEFAULT_PORT`).
"""

#: The console's port unless ``--port`` says otherwise.
DEFAULT_PORT = 8321

__all__ = ["DEFAULT_PORT"]
