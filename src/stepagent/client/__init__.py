"""``stepagent.client``: talk to a stepagent deployment from Python — send messages, follow the replies,
answer a tool's questions — without reading the shared output queue.

```python
from stepagent.client import Client

async with Client(stack="stepagent") as client:      # or Client(settings), or Client() for the environment
    message_id = await client.send("conv-1", "What is the weather in Paris?")
    async for item in client.replies("conv-1", partial=True):
        print(item["kind"], item.get("text"))
```

:class:`SyncClient` has the same methods without ``await`` (``with SyncClient(stack=...) as client``).

Guarantees:

- **Any deployment.** Built from a CloudFormation stack's outputs (``stack=``, through
  :func:`stepagent.aws.stack_outputs.stack_environment`), from explicit :class:`~stepagent.aws.settings.Settings`,
  or from the ``STEPAGENT_*`` settings and ``AWS_ENDPOINT_URL`` (moto, LocalStack) of the environment.
  It needs the conversation and state tables and the input queue (and the blob bucket for big payloads).
- **Reads the stores, not the output queue.** Replies are committed rows read with strongly consistent
  reads after the last order seen, per thread of the tree (children through the store's child index), so
  any number of clients can follow any conversation without taking events from each other.
- **Knows when the turn is over.** :meth:`Client.replies` ends, and :meth:`Client.wait` returns, when the
  thread tree is idle: the messages sent are processed, no thread has an open call, held input, compaction
  or a message from another thread on its way — a call waiting for a person's decision counts as idle
  (see :mod:`stepagent.client.watch` for the exact rule).
- **Live, never mistaken for committed.** With ``partial=True`` the replies include ``partial`` items: the
  text a completion has streamed so far (written by the worker at most five times a second, unless
  ``STEPAGENT_LIVE_TEXT=off``), shown only until the commit that makes it history.
- **Questions and links.** A tool's pending user choice is a ``choice`` item, answered with
  :meth:`Client.answer_choice`; OAuth links (``oauth``) and errors (``error``) are items too.
- **Approvals.** A tool call waiting for a person is a ``tool_call`` item with ``approval: "pending"``
  (shown once per client, also when the watch starts after it), decided with :meth:`Client.approve`, which
  sends the decision to whichever thread of the tree waits on the call; :meth:`Client.pending_approvals`
  lists them.
- **Typed items.** Every item is a :class:`Item` (a ``TypedDict``: ``thread_id`` and ``kind`` always,
  ``kind`` a ``Literal``, the other keys typed by what each kind carries), so a type checker follows them.
- **Rides out transient AWS failures.** A send, an approval, a history read or a snapshot of the tree that
  fails on throttling, a 5xx or a connection error is tried again after a jittered wait, five tries at most
  (:func:`stepagent.aws.transient.retry_transient`); a send keeps its message id, so a repeat is absorbed.
"""

from stepagent.client.api import Client, ClientError
from stepagent.client.sync import SyncClient
from stepagent.client.watch import Cursor
from stepagent.transcript import Item

__all__ = ["Client", "ClientError", "Cursor", "Item", "SyncClient"]
