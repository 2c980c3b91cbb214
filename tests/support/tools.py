"""The function tool the parser tests call, one definition for every suite that sends it (also run
by vLLM's Python: no imports)."""

from __future__ import annotations

from typing import Any, Final

WEATHER_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
