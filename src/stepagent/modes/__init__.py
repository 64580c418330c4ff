"""How the engine is driven: step mode (:mod:`~stepagent.modes.step_mode`, ``AgentSystem.step(batch)``, what
the queue worker calls) and local mode (:mod:`~stepagent.modes.local`, long-lived agents in one process).

Both run every batch as one :class:`~stepagent.core.step.ThreadStep`, so they share every durability
guarantee of the step; neither imports AWS code.
"""
