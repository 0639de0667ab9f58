"""Serving an app: uvicorn on a host and port (``memory-pipelines serve``), or in a thread
for tests and benchmarks.

On a loopback address ``serve`` binds its port and answers at once while the memory home
opens in a background thread (:class:`StartingApp`): meanwhile ``GET /healthz`` answers
503 ``{"status": "starting"}``, and any other request waits for the opening (at most
``OPEN_WAIT_S`` seconds, then 503 with ``Retry-After``). Once open, every request goes to
the API. When the home cannot be opened the reason goes to stderr and the command exits 1.
On any other address the home opens first: whether the address may be bound depends on
the home's API keys."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from memory_pipelines.apps.launch import home_in_place
from memory_pipelines.errors import MemoryPipelineError

if TYPE_CHECKING:
    from memory_pipelines.service import MemoryService

logger = logging.getLogger(__name__)

#: How long a request that arrives while the home opens waits for it (seconds).
OPEN_WAIT_S = 60.0

#: ``/healthz`` while the home opens (the fields of the API's health answer)
STARTING = {
    "status": "starting",
    "notes_version": None,
    "examples_version": None,
    "counts": {},
    "reason": "the memory home is opening",
}


class StartingApp:
    """The ASGI app ``serve`` runs: answers while the home opens, then hands every request
    to the API (:attr:`app`, set by :meth:`ready`). See the module docstring."""

    def __init__(self, wait_s: float = OPEN_WAIT_S) -> None:
        self.wait_s = wait_s
        self.app: Any = None
        self.problem: str | None = None
        self._done = threading.Event()

    def ready(self, app: Any) -> None:
        self.app = app
        self._done.set()

    def failed(self, problem: str) -> None:
        self.problem = problem
        self._done.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # the API's own shutdown is run by ``serve``
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if self.app is None and scope["type"] == "http" and scope.get("path") == "/healthz":
            body = dict(STARTING)
            if self.problem is not None:
                body.update(status="degraded", reason=self.problem)
            return await _answer(send, 503, body)
        if self.app is None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self._done.wait, self.wait_s)
        if self.app is not None:
            return await self.app(scope, receive, send)
        if scope["type"] != "http":
            return  # a websocket: closed unanswered
        detail = self.problem or f"the memory home is still opening after {self.wait_s:g} seconds"
        await _answer(send, 503, {"detail": detail}, retry_after=True)


async def _answer(send: Any, status: int, body: dict[str, Any], retry_after: bool = False) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if retry_after:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def _open(home: str | None, overrides: dict[str, Any]) -> tuple[MemoryService, Any]:
    """Open the service and build the API over it (what ``serve`` runs before answering)."""
    from memory_pipelines.apps.http.app import create_app
    from memory_pipelines.apps.http.write_queue import write_queue_enabled
    from memory_pipelines.injection.attribution import buffer_attribution
    from memory_pipelines.service import MemoryService

    svc = MemoryService.from_env(home, **overrides)
    try:
        buffer_attribution(svc.context)
        svc.warm_up(background=True)  # the model loads while the server answers
        return svc, create_app(svc, write_queue=write_queue_enabled())
    except BaseException:
        svc.close()
        raise


def serve(
    home: str | None, host: str, port: int, *, llm: str | None = None, log_level: str = "info"
) -> int:
    """``memory-pipelines serve``: open the memory home and serve the API until stopped.

    Writes go through the group-commit writer unless ``MEMORY_WRITE_QUEUE=off``; the
    injection attribution is buffered (flushed in batches, and when the server stops).
    On loopback the port is bound before the home has opened (see the module docstring)."""
    from memory_pipelines.keys import is_loopback

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    overrides: dict[str, Any] = {}
    if llm:
        overrides["llm"] = llm
    if not is_loopback(host):
        return _serve_opened(home, host, port, overrides, log_level)
    try:
        home_in_place(home)  # refused in one line before the port is bound
    except MemoryPipelineError as e:
        print(f"memory-pipelines serve: {e}", file=sys.stderr)
        return 1
    starting = StartingApp()
    opened: list[tuple[MemoryService, Any]] = []
    server = _server(starting, host, port, log_level)

    def open_home() -> None:
        try:
            opened.append(_open(home, overrides))
        except MemoryPipelineError as e:
            print(f"memory-pipelines serve: {e}", file=sys.stderr)
            starting.failed(str(e))
            server.should_exit = True
        except BaseException as e:  # noqa: BLE001 - logged with its traceback
            logger.exception("opening the memory home failed")
            starting.failed(f"opening the memory home failed ({type(e).__name__})")
            server.should_exit = True
        else:
            starting.ready(opened[0][1])

    opener = threading.Thread(target=open_home, name="memory-open", daemon=True)
    opener.start()
    try:
        code = _run(server)
    finally:
        opener.join()
        for svc, app in opened:
            try:
                writer = getattr(app.state, "write_queue", None)
                if writer is not None:
                    writer.close()  # what the API's own lifespan does when it stops
            finally:
                svc.close()
    return 1 if starting.problem is not None else code


def _serve_opened(
    home: str | None, host: str, port: int, overrides: dict[str, Any], log_level: str
) -> int:
    """``serve`` on a non-loopback address: the home opens first, since whether the
    address may be bound depends on its API keys."""
    from memory_pipelines.apps.http.app import create_app
    from memory_pipelines.apps.http.write_queue import write_queue_enabled
    from memory_pipelines.injection.attribution import buffer_attribution
    from memory_pipelines.keys import bind_refusal
    from memory_pipelines.service import MemoryService

    try:
        svc = MemoryService.from_env(home, **overrides)
    except MemoryPipelineError as e:
        print(f"memory-pipelines serve: {e}", file=sys.stderr)
        return 1
    try:
        refusal = bind_refusal(host, svc.sources)
        if refusal is not None:
            print(refusal, file=sys.stderr)
            return 1
        buffer_attribution(svc.context)
        svc.warm_up(background=True)  # the model loads while the server starts
        return run_server(create_app(svc, write_queue=write_queue_enabled()), host, port, log_level)
    finally:
        svc.close()


@contextmanager
def serving_in_thread(app: Any, *, start_timeout: float = 30) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in a background thread for the
    block (tests, benchmarks); yields its base URL. The socket is bound before the server
    starts, so no other process can take the port meanwhile."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def _server(app: Any, host: str, port: int, log_level: str) -> Any:
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=10
    )
    return uvicorn.Server(config)


def _run(server: Any) -> int:
    """Run a uvicorn server in the foreground until SIGINT or SIGTERM (or until something
    sets its ``should_exit``); 1 when it never started, e.g. its port was taken."""

    def stop(signum: int, frame: Any) -> None:
        # uvicorn handles SIGINT/SIGTERM itself while serving and re-raises the signal
        # after its graceful shutdown; answering it here lets the caller close its service
        # and the command exit 0 instead of dying by the default handler.
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if server.started else 1


def run_server(app: Any, host: str, port: int, log_level: str) -> int:
    """Serve ``app`` with uvicorn in the foreground until SIGINT or SIGTERM; the exit code
    of a server command (1 when it never started, e.g. its port was taken)."""
    return _run(_server(app, host, port, log_level))
