"""The reasoning-token count of a chat's answer, by the configured reasoning parser, in a render
process: ``usage.completion_tokens_details.reasoning_tokens`` as the engine's own chat API writes
it (its parser's ``count_reasoning_tokens`` over each choice's output ids, summed).

Neither the engine's generate answer nor vLLM's derender carries the count, so the OpenAI front
asks for it here, on a route of the render process's own app that only the front calls
(``ROUTE``; the front's HTTP server has no such route). The parser is built as vLLM's derender
builds it for the request (its tools, its resolved chat-template arguments), one per choice as the
engine's API builds one per choice.
"""

from __future__ import annotations

import logging
from typing import Any, Final

logger = logging.getLogger(__name__)

#: The render process's route; its body: ``{"chat_request": {...}, "token_ids": [[...], ...]}``,
#: its answer ``{"reasoning_tokens": [n, ...]}``, or null without a reasoning parser.
ROUTE: Final = "/mmprep/reasoning_tokens"


def counts(derenderer: Any, chat_request: dict[str, Any], token_ids: list[list[int]]) -> list[int] | None:
    """Each output's reasoning tokens, or None where the derenderer has no parser."""
    if derenderer is None or derenderer.parser is None:
        return None
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest.model_validate(chat_request)
    template_kwargs = derenderer._resolve_chat_template_kwargs(request)
    tokenizer = derenderer.renderer.get_tokenizer()
    return [
        int(
            derenderer.parser(
                tokenizer, request.tools, chat_template_kwargs=template_kwargs, model_config=derenderer.model_config
            ).count_reasoning_tokens(ids)
        )
        for ids in token_ids
    ]


def install(app: Any, reasoning_parser: str | None) -> None:
    """``ROUTE`` on the render process's app; it counts only where a reasoning parser is given
    (the engine's API writes the details only then)."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    async def reasoning_tokens(raw: Request) -> JSONResponse:
        if not reasoning_parser:
            return JSONResponse({"reasoning_tokens": None})
        body = await raw.json()
        try:
            found = counts(getattr(raw.app.state, "online_derenderer", None), body["chat_request"], body["token_ids"])
        except Exception as exc:  # noqa: BLE001 - a count that cannot be made leaves the details out
            logger.warning("reasoning tokens not counted: %s: %s", type(exc).__name__, exc)
            found = None
        return JSONResponse({"reasoning_tokens": found})

    app.add_route(ROUTE, reasoning_tokens, methods=["POST"])
