"""What both components' /metrics carry besides their own series (import-light: the operator uses it).

Each server keeps a registry of its own (tests run several in one process), so the collectors the
default registry has are added to it here: the process's CPU, memory and file descriptors, the
interpreter's GC, and its version. They read the process itself, so one instance serves every
registry.
"""

from __future__ import annotations

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry


def add_process_collectors(registry: CollectorRegistry) -> None:
    for collector in (PROCESS_COLLECTOR, GC_COLLECTOR, PLATFORM_COLLECTOR):
        registry.register(collector)
