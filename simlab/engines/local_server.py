"""What the engines' servers share: a free port on loopback, and the wait for a started server
to answer its health check (``llama-server`` and ``vllm serve`` both serve ``/health``)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from simlab.common.errors import SimlabError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, name: str, timeout_s: float, tail: Callable[[], str],
                 where: str = "", poll_s: float = 0.25) -> None:
    """Return once ``url``/health answers 200; a server that exits first is one line ending in
    ``tail()`` (its log's last words), one that never answers within ``timeout_s`` another, each
    followed by ``where`` (e.g. where its log is)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SimlabError(f"{name} exited {proc.returncode} while starting: {tail()}{where}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(poll_s)
    raise SimlabError(f"{name} did not answer {url}/health within {timeout_s:.0f} s{where}")
