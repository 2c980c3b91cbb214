"""Check a value against a structural OpenAPI schema the way the API server does with a CRD's.

The upstream core/v1 fields (``corev1``) are kept as the plain objects the user wrote, so that the
pods get them exactly as written; what checks them here is the very schema the CRD publishes, walked
by this module. So ``mmprep-operator render`` and the reconciler refuse what the API server refuses
under kubectl's default strict field validation: an unknown field, a wrong type, a missing
required field, a value outside an enum, a string that misses its pattern (a bad quantity), two
list entries with the same map key. (A JSON Schema library would not do: it knows nothing of
``x-kubernetes-int-or-string``, list-map keys or pruning, and the schema is ours to keep small.)

What the API server checks beyond the schema (a volume with two sources, a label value's syntax)
the Deployment's own validation catches when the operator applies it; the reconciler reports
that failure in status (``ApplyFailed``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

_TYPES: Mapping[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def _is(value: Any, type_: str) -> bool:
    # bool is an int in Python, never in JSON.
    if isinstance(value, bool) and type_ in ("integer", "number"):
        return False
    return isinstance(value, _TYPES[type_])


def errors(value: Any, schema: Mapping[str, Any], path: str = "") -> Iterator[str]:
    """Each way ``value`` breaks ``schema``, as ``path: what``; nothing when it fits."""
    where = path or "."
    if schema.get("x-kubernetes-int-or-string"):
        if not (_is(value, "integer") or _is(value, "string")):
            yield f"{where}: must be an integer or a string"
            return
    elif "type" in schema and not _is(value, schema["type"]):
        yield f"{where}: must be of type {schema['type']}"
        return
    if "enum" in schema and value not in schema["enum"]:
        yield f"{where}: must be one of {', '.join(map(str, schema['enum']))}"
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        yield f"{where}: {value!r} does not match {schema['pattern']}"
    if isinstance(value, dict):
        yield from _object_errors(value, schema, path)
    if isinstance(value, list):
        yield from _array_errors(value, schema, path)


def _object_errors(value: dict[str, Any], schema: Mapping[str, Any], path: str) -> Iterator[str]:
    properties = schema.get("properties")
    additional = schema.get("additionalProperties")
    for key in schema.get("required", ()):
        if key not in value:
            yield f"{path}.{key}: required"
    for key, sub in value.items():
        if properties is not None and key in properties:
            yield from errors(sub, properties[key], f"{path}.{key}")
        elif isinstance(additional, dict):
            yield from errors(sub, additional, f"{path}.{key}")
        elif properties is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
            # The API server prunes it, or (kubectl's default, fieldValidation=Strict) refuses it.
            yield f"{path}.{key}: unknown field"


def _array_errors(value: list[Any], schema: Mapping[str, Any], path: str) -> Iterator[str]:
    items = schema.get("items", {})
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        yield f"{path or '.'}: at most {schema['maxItems']} entries"
    for i, item in enumerate(value):
        yield from errors(item, items, f"{path}[{i}]")
    if schema.get("x-kubernetes-list-type") == "map":
        keys = schema.get("x-kubernetes-list-map-keys", ())
        seen: set[tuple[Any, ...]] = set()
        for i, item in enumerate(value):
            if isinstance(item, dict):
                key = tuple(item.get(k) for k in keys)
                if key in seen:
                    yield f"{path}[{i}]: duplicate entry with {', '.join(f'{k}={v!r}' for k, v in zip(keys, key, strict=True))}"
                seen.add(key)
