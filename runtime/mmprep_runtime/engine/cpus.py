"""How many CPUs this process may use, and how many torch intra-op threads each worker gets.

A container's CPU limit shows up as a cgroup quota, not in ``os.cpu_count()``; a CPU set shows up
as the affinity mask. Both count. Workers x intra-op threads must not exceed the result: measured
on 2 cores, two workers with one thread each beat one worker with two threads (92 vs 51 req/s),
because parallelism across requests does not wait on the slowest op inside one.
"""

from __future__ import annotations

import math
import os
import pathlib
from typing import Final

_CGROUP_V2_MAX: Final = pathlib.Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1_QUOTA: Final = pathlib.Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
_CGROUP_V1_PERIOD: Final = pathlib.Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def affinity_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cgroup_quota_cpus(
    v2_max: pathlib.Path = _CGROUP_V2_MAX,
    v1_quota: pathlib.Path = _CGROUP_V1_QUOTA,
    v1_period: pathlib.Path = _CGROUP_V1_PERIOD,
) -> float | None:
    """The CPU quota as a number of CPUs, or None when unlimited or unknown."""
    try:
        quota, period = v2_max.read_text().split()[:2]
        if quota == "max":
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(v1_quota.read_text())
        period_us = int(v1_period.read_text())
    except (OSError, ValueError):
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def usable_cpus() -> int:
    """Whole CPUs this process may use: the smaller of affinity and quota (a quota of 1.5 gives 1)."""
    cpus = affinity_cpus()
    quota = cgroup_quota_cpus()
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))
    return max(1, cpus)


def intra_op_threads(workers: int, cpus: int) -> int:
    """Threads per worker so that workers x threads <= cpus, at least one."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    return max(1, cpus // workers)
