"""Serving an app: uvicorn on a host and port (``memory-pipelines serve``), or in a thread
for tests and benchmarks."""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from memory_pipelines.apps.http.app import create_app
from memory_pipelines.apps.http.write_queue import write_queue_enabled
from memory_pipelines.errors import (
    MemoryPipelineError,
)
from memory_pipelines.injection.attribution import buffer_attribution
from memory_pipelines.keys import bind_refusal
from memory_pipelines.service import MemoryService


def serve(
    home: str | None, host: str, port: int, *, llm: str | None = None, log_level: str = "info"
) -> int:
    """``memory-pipelines serve``: open the memory home and serve the API until stopped.

    Writes go through the group-commit writer unless ``MEMORY_WRITE_QUEUE=off``; the
    injection attribution is buffered (flushed in batches, and when the server stops)."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    overrides: dict[str, Any] = {}
    if llm:
        overrides["llm"] = llm
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


def run_server(app: Any, host: str, port: int, log_level: str) -> int:
    """Serve ``app`` with uvicorn in the foreground until SIGINT or SIGTERM; the exit code
    of a server command (1 when it never started, e.g. its port was taken)."""
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=10
    )
    server = uvicorn.Server(config)

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
