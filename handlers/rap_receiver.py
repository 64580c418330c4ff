"""Lambda handler: the RAP receiver (Function URL request carrying a RAP callback → input queue).

Rejects unauthenticated or malformed callbacks with a 4xx and a JSON error; see
:mod:`stepagent.aws.rap_receiver` for the guarantees.
"""

from stepagent.aws.rap_receiver import rap_receiver_handler as handler

__all__ = ["handler"]
