"""Whether this node's inference servers generate, for ``status`` ("slow or hung?"): a thread
of its own probes their counters once a period, so a wedged server never holds the sidecar's
loop; a server generates when its generated-token counter moved since the probe before. The
sidecar publishes the summary in its node status; ``status`` sums the nodes.

A server that once answered and now refuses connections is a fact at any moment of the job:
the pulse keeps probing it after its process is gone, and ``refused`` names it, for the leader
to look at once (trigger ``server_refused``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from areal_watchdog.evidence.rollout_side.servers import probe_all

PULSE_PERIOD_S = 5.0  # between two probes of the same server
PROBE_TIMEOUT_S = 2.0


class ServerPulse:
    """The generation rate of each server found on this node, from its last two probes."""

    def __init__(
        self,
        period: float = PULSE_PERIOD_S,
        probe: Callable[[list[str], float], list[dict[str, Any]]] = probe_all,
    ) -> None:
        self.addresses: list[str] = []  # set by the sidecar's loop each poll
        self.period, self.probe = period, probe
        self.lock = threading.Lock()
        self.last: dict[str, tuple[float, float]] = {}  # address -> (time, generated tokens)
        self.rates: dict[str, float] = {}  # address -> tokens/s (0: silent or down)
        self.answered: set[str] = set()  # the servers that were up at some probe
        self.refusing: dict[str, float] = {}  # address -> since when it refuses connections
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="server-pulse", daemon=True)

    def start(self) -> None:
        """Start probing (once: later calls do nothing)."""
        if self.thread.ident is None:
            self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        while not self.stopped.wait(self.period):
            with self.lock:  # a server that answered once is probed after its process ended
                targets = list(dict.fromkeys([*self.addresses, *sorted(self.answered)]))
            if targets:
                self.sample(targets)

    def sample(self, addresses: list[str]) -> None:
        """Probe each server once; its rate since the probe before (0 when it is not up)."""
        for result in self.probe(addresses, PROBE_TIMEOUT_S):
            address, at = result["address"], float(result["time"])
            tokens = result.get("generated_tokens")
            with self.lock:
                self._note_state(address, str(result.get("state")), at)
                before = self.last.get(address)
                if result.get("state") != "up" or not isinstance(tokens, (int, float)):
                    self.rates[address] = 0.0
                    continue
                self.last[address] = (at, float(tokens))
                if before is not None and at > before[0]:
                    self.rates[address] = max(0.0, (tokens - before[1]) / (at - before[0]))

    def _note_state(self, address: str, state: str, at: float) -> None:
        if state == "up":
            self.answered.add(address)
            self.refusing.pop(address, None)
        elif state == "unreachable" and address in self.answered:
            self.refusing.setdefault(address, at)
        else:
            self.refusing.pop(address, None)

    def refused(self) -> dict[str, float]:
        """The servers that answered once and refused connections at their last probe, with
        the time of the first probe that found them refusing."""
        with self.lock:
            return dict(sorted(self.refusing.items()))

    def summary(self) -> dict[str, Any] | None:
        """``{"of": servers, "generating": those whose counter moved, "tokens_per_s": sum}``."""
        with self.lock:
            if not self.rates:
                return None
            rates = list(self.rates.values())
        return {"of": len(rates), "generating": sum(r > 0 for r in rates),
                "tokens_per_s": round(sum(rates), 1)}  # fmt: skip
