"""Conversation lifecycle: export, import (copy or restore) and rewind of thread trees.

- :func:`export_lines` streams a tree as versioned JSON lines with bounded memory
  (:mod:`~stepagent.lifecycle.export` defines the format).
- :func:`import_tree` validates a whole file before writing anything, then recreates the tree — under fresh
  ids with ``new_root`` — so that it becomes reachable only with its last write (the root's head flip);
  with ``replace_existing`` it restores a tree in place (:mod:`~stepagent.lifecycle.importer`).
- :func:`rewind_thread` drops everything after a committed order in one conditional write, never inside a
  tool call/result pair, cleaning up what started after the cut (:mod:`~stepagent.lifecycle.rewind`).

Every history change other than an append goes through the stores' replacement primitives
(:meth:`~stepagent.stores.base.ConversationStore.rewind`, ``stage_history``, ``sweep_generations``), so a
reader always sees exactly the old or the new history of a thread, whatever crashes in between.
"""

from stepagent.lifecycle.export import ImportFormatError, LifecycleError, export_lines
from stepagent.lifecycle.importer import ImportLimits, ImportResult, import_tree
from stepagent.lifecycle.rewind import RewindResult, effective_cut, rewind_thread

__all__ = [
    "ImportFormatError",
    "ImportLimits",
    "ImportResult",
    "LifecycleError",
    "RewindResult",
    "effective_cut",
    "export_lines",
    "import_tree",
    "rewind_thread",
]
