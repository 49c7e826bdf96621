"""Named random sub-streams derived from one seed.

``random.Random(f"{seed}:{name}")`` seeds through SHA-512 of the string, so a stream does not
depend on ``PYTHONHASHSEED`` and adding a new stream never shifts an existing one.
"""

from __future__ import annotations

import random

__all__ = ["Streams"]


class Streams:
    """``streams["schedule"]`` is the same ``random.Random`` every time it is asked for."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._made: dict[str, random.Random] = {}

    def __getitem__(self, name: str) -> random.Random:
        if name not in self._made:
            self._made[name] = random.Random(f"{self.seed}:{name}")  # noqa: S311 -- simulation
        return self._made[name]

    def fresh(self, name: str) -> random.Random:
        """A new stream (not cached): for a value that must not depend on earlier draws."""
        return random.Random(f"{self.seed}:{name}")  # noqa: S311 -- simulation
