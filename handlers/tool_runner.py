"""Lambda handler: the tool runner (tool-queue batch → function-tool runs → results on the input queue).

See :mod:`stepagent.aws.tool_runner` for the guarantees.
"""

from stepagent.aws.lambda_entry import tool_runner_handler as handler

__all__ = ["handler"]
