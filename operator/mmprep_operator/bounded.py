"""A dict kept bounded like a small LRU: the one definition both of the operator's caches use.

``remember`` puts an entry in as the newest (a dict keeps insertion order); beyond ``size``
entries the oldest go. Used for the probe and calibration answers (``control.shared_jobs``)
and for the counts of the Events the API client wrote (``kube``): caches where a lost entry
costs one more API call, never a wrong answer.
"""

from __future__ import annotations

from typing import TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")


def remember(cache: dict[_K, _V], key: _K, value: _V, *, size: int) -> None:
    """Put ``value`` in ``cache`` as its newest entry; beyond ``size`` entries the oldest goes."""
    cache.pop(key, None)
    cache[key] = value
    while len(cache) > size:
        cache.pop(next(iter(cache)))
