"""Spread a resource's total replicas over its pools, deterministically.

Rule (documented in docs/operator.md): replicas are shared in proportion to each pool's eligible node
count by the largest-remainder method. Every pool first gets the floor of its exact share; the
replicas left over go one each to the pools with the largest remainders, ties broken by more
nodes, then by pool name. So the result depends only on (total, weights), sums to the total, and
never moves a replica between pools unless the total or the weights change.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction


def distribute(total: int, weights: Mapping[str, int]) -> dict[str, int]:
    if total < 0:
        raise ValueError(f"total replicas must be >= 0, got {total}")
    if any(w < 0 for w in weights.values()):
        raise ValueError(f"weights must be >= 0, got {dict(weights)}")
    if not weights:
        return {}
    weight_sum = sum(weights.values())
    if weight_sum == 0:
        # No information: share equally.
        weights = dict.fromkeys(weights, 1)
        weight_sum = len(weights)
    shares = {name: Fraction(total * w, weight_sum) for name, w in weights.items()}
    out = {name: int(share) for name, share in shares.items()}
    left = total - sum(out.values())
    order = sorted(weights, key=lambda n: (-(shares[n] - out[n]), -weights[n], n))
    for name in order[:left]:
        out[name] += 1
    return out
