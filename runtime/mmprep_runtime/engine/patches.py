"""Processor-specific patches, bound so that a deep copy carries them to the copy.

A patch written as a closure over the original object keeps calling the original after
``copy.deepcopy`` (the closure is copied by reference), so every worker would silently share it.
A function bound with ``types.MethodType`` is deep-copied as a new method bound to the copy of its
``__self__``; its settings live on the instance, so they are copied with it.

Every tokenizer lookup goes through ``tokenizer_of``: some processors are a bare tokenizer with no
``.tokenizer`` attribute, and construction and clones must resolve the same way.
"""

from __future__ import annotations

import types
from typing import Any, Final

_DEFAULTS_ATTRIBUTE: Final = "_mmprep_default_kwargs"


def tokenizer_of(processor: Any) -> Any:
    """The tokenizer behind a processor; a bare tokenizer is its own."""
    tokenizer = getattr(processor, "tokenizer", None)
    return tokenizer if tokenizer is not None else processor


_TRANSFORMS_ATTRIBUTE: Final = "_mmprep_input_transforms"


def _call_with_defaults(self: Any, *args: Any, __mmprep_method: str, **kwargs: Any) -> Any:
    defaults: dict[str, dict[str, Any]] = getattr(self, _DEFAULTS_ATTRIBUTE)
    for key, value in defaults[__mmprep_method].items():
        kwargs.setdefault(key, value)
    transform = getattr(self, _TRANSFORMS_ATTRIBUTE, {}).get(__mmprep_method)
    if transform is not None:
        param, function, extra = transform
        if param in kwargs:
            kwargs[param] = _apply(function, kwargs[param], extra)
        elif args:
            args = (_apply(function, args[0], extra), *args[1:])
    return getattr(type(self), __mmprep_method)(self, *args, **kwargs)


def _apply(function: Any, value: Any, extra: tuple[Any, ...]) -> Any:
    # Flat lists only: a single item or nested lists (a batch of lists, video frames) pass as they are.
    return function(value, *extra) if isinstance(value, list) else value


def bind_input_transform(obj: Any, method_name: str, param: str, function: Any, *extra: Any) -> None:
    """Pass ``obj.<method_name>``'s ``param`` (keyword, or first positional) through
    ``function(value, *extra)`` when it is a list. ``function`` must be module-level (deep copies
    share it); the table lives on the instance, like the defaults."""
    table: dict[str, tuple[str, Any, tuple[Any, ...]]] = dict(getattr(obj, _TRANSFORMS_ATTRIBUTE, {}))
    table[method_name] = (param, function, extra)
    setattr(obj, _TRANSFORMS_ATTRIBUTE, table)
    bind_default_kwargs(obj, method_name)


def _make_bound(method_name: str) -> types.FunctionType:
    # One small module-level function per method name; the instance carries the defaults.
    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _call_with_defaults(self, *args, __mmprep_method=method_name, **kwargs)

    patched.__name__ = method_name
    return patched  # type: ignore[return-value]


def bind_default_kwargs(obj: Any, method_name: str, **defaults: Any) -> None:
    """Make ``obj.<method_name>`` default ``defaults`` (e.g. ``device="cuda"``) for this instance.

    The patch is an instance attribute bound with ``types.MethodType`` to ``obj``, so
    ``copy.deepcopy(obj)`` yields a copy whose patch is bound to the copy.
    """
    if not callable(getattr(type(obj), method_name, None)):
        raise AttributeError(f"{type(obj).__name__} has no method {method_name!r} to patch")
    table: dict[str, dict[str, Any]] = dict(getattr(obj, _DEFAULTS_ATTRIBUTE, {}))
    table[method_name] = {**table.get(method_name, {}), **defaults}
    setattr(obj, _DEFAULTS_ATTRIBUTE, table)
    setattr(obj, method_name, types.MethodType(_make_bound(method_name), obj))
