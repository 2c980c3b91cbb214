"""What every API request runs inside: readiness, admission, the deadline, metrics, error mapping.

``admitted`` wraps one API handler (``apis.preprocess``, ``apis.vllm_render_server``): every HTTP
API shares all of it, only the error JSON's shape is the API's (``render_error``). Errors are
typed (``errors``): each carries its status; nothing here picks one.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.apis.routing import ErrorResponse, Handler
from mmprep_runtime.engine import executor
from mmprep_runtime.server.state import SHUTTING_DOWN, STATE, not_serving_reason

logger = logging.getLogger(__name__)


async def admitted(
    request: web.Request, handler: Handler, render_error: ErrorResponse, *, generates: bool = False
) -> web.StreamResponse:
    """Readiness, admission, deadline, metrics and error mapping around one API handler. A route
    that ``generates`` (the OpenAI front) is admitted by the front's own slots and has no
    deadline here: it takes a render slot and the deadline for its render itself."""
    state = request.app[STATE]
    arrived = time.perf_counter()
    outcome = "ok"
    try:
        serving, reason = state.serving, not_serving_reason(state)
        admission = state.generations if generates else state.admission
        if reason == SHUTTING_DOWN:
            retry = state.settings.load.retry_after_s
            raise errors.ShuttingDown(
                f"this pod is shutting down; retry in {retry} s (another pod answers)", headers={"Retry-After": str(retry)}
            )
        if reason is not None or serving is None or admission is None:
            raise errors.NotReady(f"not ready: {reason or 'the processor is loading'}")
        if not admission.try_enter():
            retry = state.settings.load.retry_after_s
            raise errors.Overloaded(
                f"all {admission.capacity} {'generation' if generates else 'request'} slots are taken; retry in {retry} s",
                headers={"Retry-After": str(retry)},
            )
        try:
            async with asyncio.timeout(None if generates else state.settings.load.deadline_s):
                answer = await handler(request, serving)
                state.metrics.decode_seconds.observe(answer.decode_seconds)
                return answer.response
        except executor.NoWorkersLeft as exc:
            # Every worker's clone failed after start-up: the pod cannot serve (readiness says so).
            raise errors.NotReady(f"not ready: {exc}") from None
        except TimeoutError:
            raise errors.DeadlineExceeded(f"no answer within the deadline of {state.settings.load.deadline_s:g} s") from None
        finally:
            admission.leave()
    except errors.RequestError as error:
        outcome = error.code
        if error.status >= 500:
            logger.warning("%s failed (%d): %s", request.path, error.status, error.message)
        return render_error(error)
    except asyncio.CancelledError:
        outcome = errors.CLIENT_GONE  # the client disconnected (or the server is stopping)
        raise
    except Exception as exc:  # noqa: BLE001 - a bug: answer like every other failure, log the traceback
        logger.exception("%s failed unexpectedly", request.path)
        internal = errors.InternalError(f"internal error: {type(exc).__name__}: {exc}")
        outcome = internal.code
        return render_error(internal)
    finally:
        state.metrics.answered(outcome, time.perf_counter() - arrived)
        if not state.drain.ready:
            refused = outcome == errors.ShuttingDown.code
            state.drain.answered(refused)
            state.metrics.answered_while_draining(refused)
