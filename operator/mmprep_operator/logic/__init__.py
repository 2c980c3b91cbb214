"""The pure layer: pools, decisions, replicas, object identity, rendering, status, conditions, Events.

No I/O, no kopf, no API client (the contracts in ``pyproject.toml``): everything here is a function
of its inputs, so ``mmprep-operator render``, the golden tests and the reconciler agree byte for
byte. ``plan`` is the composition both of them call.
"""
