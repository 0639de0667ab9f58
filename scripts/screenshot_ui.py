"""Screenshot the Dagster UI's asset graph of this project.

    python scripts/screenshot_ui.py OUT.png [--home H] [--path UI_PATH] [--timeout 120]

Starts ``dagster dev -w workspace.yaml`` in its own process group on a free loopback
port (``DAGSTER_HOME=<home>/dagster`` configured as the demo does, ``MEMORY_HOME=<home>``), waits
until GraphQL answers and the code location has loaded, dismisses the community modal
(``setNuxSeen``), waits for any run the default-on sensor or schedule starts, takes a
headless chromium screenshot of the page (default: the cycle's asset group) into
``OUT.png``, and stops the server (SIGTERM to the group, SIGKILL if it lingers). Needs ``chromium``
(``apt-get install -y chromium``). No network beyond loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memory_pipelines.apps import demo

# the scripts' shared module, also when this file is loaded by path (tests)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from headless_chromium import run_chromium  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: The cycle's asset group in the code location of workspace.yaml.
DEFAULT_PATH = "/locations/memory_pipelines/asset-groups/memory_manager"
IN_PROGRESS_QUERY = (
    "{ runsOrError(filter: {statuses: [QUEUED, NOT_STARTED, STARTING, STARTED, CANCELING]}) "
    "{ ... on Runs { results { runId status } } } }"
)
LOCATION_QUERY = (
    "{ workspaceOrError { ... on Workspace { locationEntries { name "
    "locationOrLoadError { __typename } } } } }"
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listened on a moment ago (another process may take
    it before the server binds it: :func:`dagster_dev` then tries another)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def graphql(url: str, query: str, timeout: float = 5.0) -> dict:
    """POST one GraphQL query to the webserver and return the decoded reply."""
    req = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


#: How many ports :func:`dagster_dev` tries when the one it chose was taken meanwhile.
PORT_ATTEMPTS = 5


class PortTaken(RuntimeError):
    """The webserver could not bind the port chosen for it."""


def _port_taken(log_path: Path | None) -> bool:
    if log_path is None or not log_path.exists():
        return False
    text = log_path.read_text(errors="replace").lower()
    return "address already in use" in text or "errno 98" in text


def wait_until_loaded(
    url: str, proc: subprocess.Popen, timeout: float, log_path: Path | None = None
) -> None:
    """Wait until GraphQL answers and every code location has loaded (or fail); raises
    :class:`PortTaken` when the server's log says its port was taken."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if _port_taken(log_path):
            raise PortTaken(f"port of {url} was taken")
        if proc.poll() is not None:
            raise RuntimeError(f"dagster dev exited with {proc.returncode}")
        try:
            reply = graphql(url, LOCATION_QUERY)
            entries = reply["data"]["workspaceOrError"]["locationEntries"]
            kinds = [(e.get("locationOrLoadError") or {}).get("__typename") for e in entries]
            if entries and all(k == "RepositoryLocation" for k in kinds):
                return
            if "PythonError" in kinds:
                raise RuntimeError(f"code location failed to load: {reply}")
            last = f"locations {kinds}"
        except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, TypeError) as e:
            last = repr(e)
        time.sleep(1.0)
    raise TimeoutError(f"dagster dev did not become ready in {timeout:.0f}s ({last})")


def wait_for_runs(url: str, timeout: float) -> int:
    """Wait until no run is queued or in progress (the default-on sensor and schedule may
    start a cycle as soon as the daemon is up); returns how many were still going."""
    deadline = time.monotonic() + timeout
    going: list = []
    while time.monotonic() < deadline:
        try:
            going = graphql(url, IN_PROGRESS_QUERY)["data"]["runsOrError"]["results"]
        except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, TypeError):
            going = []
        if not going:
            return 0
        time.sleep(2.0)
    return len(going)


def stop(proc: subprocess.Popen) -> None:
    """Stop the server's whole process group: SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


@contextmanager
def dagster_dev(home: Path, timeout: float) -> Iterator[str]:
    """``dagster dev`` (webserver and daemon) on the code location of workspace.yaml, with
    ``MEMORY_HOME=home`` and the demo's instance under ``home/dagster``, on a free
    loopback port: yields its URL once the code location has loaded (community modal
    dismissed), stops the whole process group afterwards."""
    dagster_home = demo.dagster_home(home)
    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home),
        "MEMORY_HOME": str(home.resolve()),
        "DAGSTER_DISABLE_TELEMETRY": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    dagster = Path(sys.executable).parent / "dagster"
    log_path = dagster_home / "screenshot-server.log"
    for attempt in range(PORT_ATTEMPTS):
        # the port may be taken between choosing and binding it: then the webserver
        # fails to bind, says so in the log, and another port is tried
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(log_path, "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [str(dagster), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: SIGTERM reaches the webserver and daemon
        )
        try:
            wait_until_loaded(url, proc, timeout, log_path)
        except PortTaken:
            stop(proc)
            log.close()
            if attempt == PORT_ATTEMPTS - 1:
                raise
            continue
        except BaseException:
            stop(proc)
            log.close()
            raise
        break
    try:
        graphql(url, "mutation { setNuxSeen }")
        yield url
    finally:
        stop(proc)
        log.close()


def screenshot(out: Path, home: Path, path: str, timeout: float, size: str = "1400,900") -> Path:
    """Run the server, capture ``path`` of the UI into ``out``, stop the server."""
    with dagster_dev(home, timeout) as url:
        # let a run the default-on sensor or schedule starts finish first: the picture then
        # shows settled materializations, and stopping mid-run would leave it STARTED
        time.sleep(5.0)
        left = wait_for_runs(url, timeout)
        if left:
            print(f"warning: {left} run(s) still in progress", file=sys.stderr)
        out.parent.mkdir(parents=True, exist_ok=True)
        run_chromium(
            f"{url}{path}",
            f"--screenshot={out.resolve()}",
            "--virtual-time-budget=15000",
            size=size,
        )
    if not out.exists():
        raise RuntimeError("chromium did not write the screenshot")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="PNG file to write")
    parser.add_argument("--home", type=Path, default=None, help="memory home (default: a temp dir)")
    parser.add_argument("--path", default=DEFAULT_PATH, help="UI path to capture")
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for the server"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        home = args.home or Path(tmp) / "home"
        home.mkdir(parents=True, exist_ok=True)
        written = screenshot(args.out, home, args.path, args.timeout)
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
