"""Trees as an image holds them, kept per image for the next sandbox of it.

A docker sandbox runs nothing of its own before HEMRA's first command (PID 1 is `sleep`), and
what HEMRA puts in before the agent's turn (the instruction, the solution) lies outside the
work folder: the work folder of a fresh sandbox is its image's. Reading it costs a round trip
to the engine (~50 ms) per trial; a run's trials of one task (its attempts, its harnesses) read
it once. Kept by image ID (content, not a tag someone may move), least recently used first out,
up to `MAX_KEPT_BYTES` in all; a tree over that is never kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from pytest_hemra.execute.sandbox import Tree

MAX_KEPT_BYTES = 64 << 20


class Snapshots:
    """Image ID and path -> the tree there, least recently used dropped past `limit` bytes."""

    def __init__(self, limit: int = MAX_KEPT_BYTES) -> None:
        self.limit = limit
        self._trees: OrderedDict[tuple[str, str], Tree] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def tree(self, image_id: str, path: str, read: Callable[[], Tree]) -> Tree:
        """The tree at `path` in `image_id`, by `read` the first time; a copy each time (the
        caller may change it)."""
        key = (image_id, path)
        with self._lock:
            kept = self._trees.get(key)
            if kept is not None:
                self._trees.move_to_end(key)
                return _copy(kept)
        tree = read()
        if tree.stopped is None and tree.size <= self.limit:
            with self._lock:
                if key not in self._trees:
                    self._trees[key] = _copy(tree)
                    self._bytes += tree.size
                while self._bytes > self.limit:
                    _, dropped = self._trees.popitem(last=False)
                    self._bytes -= dropped.size
        return tree

    def clear(self) -> None:
        with self._lock:
            self._trees.clear()
            self._bytes = 0


def _copy(tree: Tree) -> Tree:
    copied = Tree()
    copied.update(tree)
    copied.skipped = dict(tree.skipped)
    copied.stopped, copied.size, copied.is_file = tree.stopped, tree.size, tree.is_file
    copied.as_image = tree.as_image
    return copied


SNAPSHOTS = Snapshots()
