"""A named registry: one per kind of variant (rewards, advantage estimators, KL estimators, ...).

    ADVANTAGES = Registry("advantage estimator")

    @ADVANTAGES.register("grpo")
    def grpo_advantages(...): ...

    fn = ADVANTAGES.get("grpo")   # unknown names raise, listing the valid ones

A twin registry implements the names of another in a second framework (the MindSpore policy
losses of the numpy ones): `Registry("policy loss", names_from=POLICY_LOSSES)` refuses any name
the first does not hold, so the first is the one source of names.

A registered function's keyword-only parameters are its settings (`params(name)`), named like the
config keys that set them.
"""

from __future__ import annotations

import inspect
from typing import Callable, Dict, Iterator, Optional, Tuple


class Registry:
    def __init__(self, kind: str, names_from: Optional["Registry"] = None):
        self.kind = kind
        self.names_from = names_from
        self._items: Dict[str, Callable] = {}

    def register(self, name: str, fn: Optional[Callable] = None, *, overwrite: bool = False):
        """Register `fn` under `name`; usable as a decorator when `fn` is omitted."""

        def add(f: Callable) -> Callable:
            if self.names_from is not None and name not in self.names_from:
                raise ValueError(f"{self.kind} {name!r} is not a name of its source registry; valid names: "
                                 f"{', '.join(self.names_from.names())}")
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

    def params(self, name: str) -> Tuple[str, ...]:
        """The keyword-only parameters of `name`'s function, in order."""
        sig = inspect.signature(self.get(name))
        return tuple(p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
