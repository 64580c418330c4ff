"""RAP — the remote asynchronous tool protocol — on both sides.

- :mod:`stepagent.rap.protocol`: the wire types (manifest, invocation, callbacks).
- :mod:`stepagent.rap.tokens`: HMAC callback tokens bound to (thread, tool call).
- :mod:`stepagent.rap.receiver`: callbacks → input messages (pure; the Lambda and local receivers share it).
- :mod:`stepagent.rap.receiver_app`: the receiver as a Starlette app (local mode, tests).
- :mod:`stepagent.rap.choices`: answering a ``user_choice``.
- :mod:`stepagent.rap.server`: a helper to write RAP tool servers.

The runtime's client side (discovery, invocation, lifecycle) is :mod:`stepagent.tools.rap`; the receiver
Lambda (Function URL → input queue) is :mod:`stepagent.aws.rap_receiver`.
"""
