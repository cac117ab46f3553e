"""A named registry: one per kind of variant (rewards, advantage estimators, KL estimators, ...).

    ADVANTAGES = Registry("advantage estimator")

    @ADVANTAGES.register("grpo")
    def grpo_advantages(...): ...

    fn = ADVANTAGES.get("grpo")   # unknown names raise, listing the valid ones
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, Optional


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._items: Dict[str, Callable] = {}

    def register(self, name: str, fn: Optional[Callable] = None, *, overwrite: bool = False):
        """Register `fn` under `name`; usable as a decorator when `fn` is omitted."""

        def add(f: Callable) -> Callable:
            if name in self._items and not overwrite:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = f
            return f

        return add if fn is None else add(fn)

    def get(self, name: str) -> Callable:
        if name not in self._items:  # no try/except: MindSpore's graph parser rejects it
            valid = ", ".join(sorted(self._items)) or "(none)"
            raise KeyError(f"unknown {self.kind} {name!r}; valid names: {valid}")
        return self._items[name]

    def names(self) -> list:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
