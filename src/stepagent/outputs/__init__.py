"""The output contract's one home: what a thread tells the outside world, the same on every surface.

- :mod:`stepagent.outputs.events` — the event kinds (typed) and the thread context a published or streamed
  event carries;
- :mod:`stepagent.outputs.build` — the events built from what a step committed (its rows, its usage
  record, its refusals), with their stable ids.

The output queue's publisher (:mod:`stepagent.aws.outputs`), the HTTP API's stream
(:mod:`stepagent.api.events`), the history and the clients all take the events from here, so a new kind
or field is added once. The notices a thread's ``LIVE`` item keeps are typed in :mod:`stepagent.notices`,
below the stores that decode them.
"""
