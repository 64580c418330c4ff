"""The engine: HistoryManager, the step algorithm, agents, compaction policy (no AWS or HTTP)."""
