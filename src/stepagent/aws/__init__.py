"""The AWS side of stepagent: settings, clients, the Lambda handlers and the resources they use."""
