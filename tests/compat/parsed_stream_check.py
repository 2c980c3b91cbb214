"""Run by vLLM's Python: a render process's derenderer (built as ``backends.vllm.worker`` builds
it, ``parsed_streams`` installed), and one parsed stream derendered call by call twice: by vLLM's
own replaying function and by the resuming one, each carrying its own ``stream_state``.

``python parsed_stream_check.py MODEL_FOLDER [vLLM's options]`` prints one JSON line: per case, the
first call whose chunk or state differ (None when none does), the calls made, and how many of the
resuming run's calls resumed and replayed.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import sys
from typing import Any

from mmprep_runtime.backends.vllm import parsed_streams, worker

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from support.tools import WEATHER_TOOL  # noqa: E402 - after the sys.path line

TOOL_CALL_TEXT = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
REASONING_TEXT = "<think>The fox is quick, and the dog is lazy.</think>A cat is sitting on a red mat next to the window."


def _steady(value: Any) -> Any:
    """Without what is random per run: a tool call's id (each run makes its own) and times."""
    if isinstance(value, dict):
        return {k: ("<id>" if k in ("id", "last_tool_call_ids") else _steady(v)) for k, v in value.items() if k != "created"}
    if isinstance(value, list):
        return [_steady(v) for v in value]
    return value


def _chunks(ids: list[int], sizes: list[int]) -> list[list[int]]:
    out, at = [], 0
    while at < len(ids):
        size = sizes[len(out) % len(sizes)]
        out.append(ids[at : at + size])
        at += size
    return out


def _stream(derenders: Any, derenderer: Any, request: Any, prompt_ids: list[int], chunks: list[list[int]]) -> list[Any]:
    """Each chunk derendered by ``derenders(i)``, the state carried from one call to the next."""
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import DerenderStreamState, GenerateTokensStreamResponse

    state = DerenderStreamState()
    answers = []
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        choice = {"index": 0, "token_ids": chunk, "finish_reason": "stop" if last else None}
        event = {
            "request_id": "r-1",
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": i + 1},
        }
        generate_chunk = GenerateTokensStreamResponse.model_validate(event)
        answer, state = derenders(i)(
            derenderer, derenderer.parser, "m", generate_chunk, state, request, len(prompt_ids), prompt_ids
        )
        answers.append(_steady([answer.model_dump(), state.model_dump()]))
    return answers


async def main(argv: list[str]) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.renderers.online_derenderer import OnlineDerenderer

    app = await worker._build_app(worker._vllm_args(argv))
    derenderer = app.state.online_derenderer
    replaying = OnlineDerenderer._derender_chat_stream_parsed.__wrapped__
    resuming = OnlineDerenderer._derender_chat_stream_parsed
    tokenizer = derenderer.renderer.get_tokenizer()
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = list(tokenizer.encode(prompt, add_special_tokens=False))
    found: dict[str, Any] = {"installed": getattr(resuming, "mmprep_resumes", False)}
    cases = {
        "a tool call, 1 token a call": (TOOL_CALL_TEXT, [1], {"tools": [WEATHER_TOOL], "tool_choice": "auto"}),
        "a tool call, 1-3 tokens a call": (TOOL_CALL_TEXT, [1, 2, 3], {"tools": [WEATHER_TOOL], "tool_choice": "auto"}),
        "a reasoning block, 2 tokens a call": (REASONING_TEXT, [2], {}),
        "a reasoning block, 1-3 tokens a call": (REASONING_TEXT, [3, 1, 2], {}),
    }
    for name, (text, sizes, fields) in cases.items():
        request = ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **fields})
        chunks = _chunks(list(tokenizer.encode(text, add_special_tokens=False)), sizes)
        theirs = _stream(lambda _: replaying, derenderer, request, prompt_ids, chunks)
        # Resuming throughout; and a stream begun by the replaying function (another server) and
        # ended by the resuming one, which replays the state it did not write, then resumes.
        for run, derenders in (("", lambda _: resuming), (", switched mid-stream", lambda i: replaying if i < 4 else resuming)):
            before = (parsed_streams.KEPT.resumed, parsed_streams.KEPT.replayed)
            ours = _stream(derenders, derenderer, request, prompt_ids, chunks)
            differs = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)
            found[name + run] = {
                "calls": len(chunks),
                "first difference": differs
                if differs is None
                else {"call": differs, "ours": ours[differs], "vllm": theirs[differs]},
                "resumed": parsed_streams.KEPT.resumed - before[0],
                "replayed": parsed_streams.KEPT.replayed - before[1],
            }
    found["kept streams"] = len(parsed_streams.KEPT)
    print(json.dumps(found))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
