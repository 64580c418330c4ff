"""Input senders: how a message reaches a thread's input queue (in process, or SQS with claim check)."""
