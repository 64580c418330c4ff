"""Lambda handler: the worker (input-queue SQS FIFO batch → one step per thread).

Returns ``{"batchItemFailures": [...]}``; see :mod:`stepagent.aws.worker` for the guarantees.
"""

from stepagent.aws.lambda_entry import worker_handler as handler

__all__ = ["handler"]
