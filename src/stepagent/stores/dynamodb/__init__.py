"""The DynamoDB implementations of the store ports, one module per concern.

- ``conversation``: :class:`DynamoConversationStore` (commit, reads) and :func:`dynamo_stores`;
- ``snapshot``: what a step reads first, in one ``BatchGetItem`` and one ``Query``;
- ``state``: :class:`DynamoStateStore`, the state table;
- ``replace``: rewind, whole-history replacement, sweep of old generations;
- ``journal``: the redo journal for head flips over the transaction limits;
- ``layout``: keys and the item codec;
- ``live``: the ``LIVE`` item clients poll;
- ``roots``: the console's list of root conversations (a Scan);
- ``quotas``: per-user counters, stream leases and daily spend;
- ``io``: counted I/O, batching, retries of transaction conflicts, the S3 claim check.

The stores are re-exported here, so ``from stepagent.stores.dynamodb import DynamoConversationStore``
keeps working; everything else is imported from its module.
"""

from stepagent.stores.dynamodb.conversation import DynamoConversationStore, dynamo_stores
from stepagent.stores.dynamodb.state import DynamoStateStore

__all__ = ["DynamoConversationStore", "DynamoStateStore", "dynamo_stores"]
