"""readyq_sim: a deterministic clock and fault simulator for readyq (installed as readyq_sim)."""

from .clock import VirtualClock

__all__ = ["VirtualClock"]
