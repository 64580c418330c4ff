"""Lambda handler: the timer relay (delay-queue batch → wake-ups on the input queue).

See :mod:`stepagent.aws.timers` for the guarantees.
"""

from stepagent.aws.lambda_entry import timer_relay_handler as handler

__all__ = ["handler"]
