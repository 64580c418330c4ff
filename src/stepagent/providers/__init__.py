"""Model providers: the provider port, the Anthropic, OpenAI-compatible, Bedrock and scripted models, and
the translation of history into their requests."""
