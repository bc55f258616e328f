"""torch's MemTracker, with its per-operation peak update made to cost what the active modules cost.

After every operation MemTracker updates the running peak of each module that is running (in ModTracker's
`parents`), and to find them it walks its whole WeakIdKeyDictionary of modules: one weak reference called per
module per operation, most of a traced step's time on a model of a few hundred modules. Here the same per-module
stats are indexed by module name, so that an operation visits only the running modules' (a handful), rebuilt
whenever that dictionary may have changed (a module seen for the first time, the stats reset, an entry dropped),
and each module's update is torch's own, so every figure, per module and overall, is the same to the byte
(tests/test_listed_tracker.py holds them to the stock tracker).
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker


class ListedMemTracker(MemTracker):
    """MemTracker whose `_update_peak_stats` walks a list of the module stats instead of the weak dictionary."""

    def __init__(self) -> None:
        super().__init__()
        self._listed: list[Any] = []
        self._listed_from = -1  # len(memory_tracking) the list was made at; -1: make it afresh
        self._by_fqn: dict[str, list[Any]] = {}

    def _pre_fw_hook(self, module: Any, inputs: Any) -> None:
        self._listed_from = -1  # the module may be new to memory_tracking
        super()._pre_fw_hook(module, inputs)

    def reset_mod_stats(self) -> None:
        self._listed_from = -1
        super().reset_mod_stats()

    def _update_peak_stats(self, peak_state: Any) -> None:
        # torch's own update (mem_tracker.py), over the list: the same stats, each updated as torch updates it
        curr_snap = self._curr_mem_snap
        if self._listed_from != len(self.memory_tracking):
            self._listed = list(self.memory_tracking.values())
            self._listed_from = len(self._listed)
            # the running modules' stats by name: a handful of the parents, not every module, per operation (each
            # module's update reads the snapshot and writes only its own stats, so the order is no matter)
            self._by_fqn = {}
            for mod_stats in self._listed:
                self._by_fqn.setdefault(mod_stats.mod_fqn, []).append(mod_stats)
        for fqn in self._mod_tracker.parents:
            for mod_stats in self._by_fqn.get(fqn, ()):
                if peak_state not in mod_stats.snapshots:
                    continue
                for dev, dev_snap in curr_snap.items():
                    if mod_stats.local_peak.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                        mod_stats.local_peak[dev] = dev_snap[_TOTAL_KEY]
                        mod_stats.snapshots[peak_state][-1][dev] = deepcopy(dev_snap)
        for dev, dev_snap in curr_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                self._peak_mem[dev] = dev_snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = deepcopy(dev_snap)


__all__ = ["ListedMemTracker"]
