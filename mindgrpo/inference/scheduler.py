"""Which request decodes in which slot: the host side of the rollout engine (numpy only).

A call generates G samples for each of its prompts; request r = prompt * G + sample. There are S
decode slots, each with its own rows of the KV cache. Requests are admitted in order (prompt by
prompt), as slots free up:

  * a prompt is prefilled once, into the slot of its first admitted sample (its "home"); its
    other samples get the prompt's cache rows copied from a slot of the same prompt;
  * a finished sample whose prompt still has samples waiting hands its slot straight to the next
    one: the prompt's rows are already there (decode writes only from position len(prompt) - 1
    on), so nothing is copied;
  * other freed slots go to the waiting samples of prompts already started, then to new prompts.
So every prompt with samples waiting keeps at least one sample decoding (its rows stay available
as a copy source), and each prompt is prefilled exactly once.

A sample starts decoding at its prompt's last token (position len(prompt) - 1): the prefill covers
the prompt without its last token, and the sample's first decode step writes that token's k/v and
draws the first new token with the sample's own random stream.

A sample of a conversation that ends its turn with a tool call is parked: it keeps its slot (and its
cache rows) without decoding until the tool's answer has been appended, then decodes on.

Per step the host work is O(slots), vectorised: the live slots, their positions and counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import numpy as np


def pow2_bucket(n: int, low: int, high: int) -> int:
    """The smallest power of two >= max(n, low), capped at high."""
    b = max(int(low), 1)
    while b < n:
        b *= 2
    return min(b, high)


def halving_buckets(cap: int, low: int) -> List[int]:
    """Every bucket `halving_bucket(., cap, low)` can return, largest first."""
    out = [cap]
    while -(-out[-1] // 2) >= max(low, 1) and -(-out[-1] // 2) < out[-1]:
        out.append(-(-out[-1] // 2))
    return out


def halving_bucket(n: int, cap: int, low: int) -> int:
    """The smallest of cap, ceil(cap / 2), ceil(cap / 4), ... that is >= n, none below low
    (cap itself may be): at most log2(cap / low) + 2 buckets, each at most twice what it holds."""
    b = cap
    while True:
        half = -(-b // 2)
        if half < max(n, low) or half == b:
            return b
        b = half


@dataclass
class Admission:
    """What one `admit` call started: prompts to prefill (with their home slots), cache copies
    (source slot, destination slot) to run after the prefill, and every slot that starts a new
    sample (homes, copies and handed-over slots alike)."""

    prefill_prompts: List[int] = field(default_factory=list)
    prefill_slots: List[int] = field(default_factory=list)
    copy_src: List[int] = field(default_factory=list)
    copy_dst: List[int] = field(default_factory=list)
    started: List[int] = field(default_factory=list)


class SlotScheduler:
    """prompts: how many; group: G samples each; slots: S."""

    def __init__(self, prompts: int, group: int, slots: int):
        self.prompts, self.group, self.slots = prompts, group, slots
        self.request = np.full(slots, -1, np.int64)  # (S,) the request a slot decodes, -1 free
        self.parked = np.zeros(slots, bool)  # (S,) its request waits for a tool's answer: not free, not decoding
        self.admitted = np.zeros(prompts, np.int64)  # samples of each prompt admitted so far
        self.next_prompt = 0  # the first prompt not started
        self._done: List[int] = []  # slots whose request finished since the last admit

    def live(self) -> np.ndarray:
        """Slots decoding a request, ascending (parked ones keep their request and do not decode)."""
        return np.flatnonzero((self.request >= 0) & ~self.parked)

    def park(self, slots: np.ndarray) -> None:
        self.parked[slots] = True

    def resume(self, slots: np.ndarray) -> None:
        self.parked[slots] = False

    def finish(self, slots: np.ndarray) -> None:
        self._done.extend(int(s) for s in slots)

    def pending(self) -> bool:
        return self.next_prompt < self.prompts or bool((self.admitted < self.group).any())

    def _take(self, prompt: int, slot: int, adm: Admission) -> None:
        self.request[slot] = prompt * self.group + self.admitted[prompt]
        self.admitted[prompt] += 1
        adm.started.append(slot)

    def admit(self) -> Admission:
        adm = Admission()
        g = self.group
        for s in self._done:  # hand over to the same prompt's next sample: its rows are in place
            p = int(self.request[s]) // g
            self.request[s], self.parked[s] = -1, False
            if self.admitted[p] < g:
                self._take(p, s, adm)
        self._done = []
        free = list(np.flatnonzero(self.request < 0))
        # samples waiting of prompts already started (each has a sample decoding: a copy source)
        for p in np.flatnonzero((self.admitted > 0) & (self.admitted < g)):
            if not free:
                return adm
            source = int(np.flatnonzero(self.request // g == p)[0])
            while free and self.admitted[p] < g:
                slot = free.pop(0)
                adm.copy_src.append(source)
                adm.copy_dst.append(slot)
                self._take(p, slot, adm)
        # new prompts: a prefill into a home slot, then copies for as many samples as slots allow
        while free and self.next_prompt < self.prompts:
            p = self.next_prompt
            self.next_prompt += 1
            home = free.pop(0)
            adm.prefill_prompts.append(p)
            adm.prefill_slots.append(home)
            self._take(p, home, adm)
            while free and self.admitted[p] < g:
                slot = free.pop(0)
                adm.copy_src.append(home)
                adm.copy_dst.append(slot)
                self._take(p, slot, adm)
        return adm
