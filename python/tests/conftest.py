"""What the pytest suite shares: a real redis-server with the dma module (DMA_MODULE, default
<build>/lib/dma.so) on a free loopback port, started from Python the way the C++ suites start
theirs (support/src/redis_server.cpp): `redis-server --port P --bind 127.0.0.1 --save ''
--appendonly no --loadmodule <dma.so> providers tcp bind 127.0.0.1` (another provider if asked),
IPATH_NO_BACKTRACE=1 in its environment, output in a log file, retried on another port if the
picked one was taken ("Address already in use"), ready once it answers PING.

Every wait has a deadline: PING is polled until START_DEADLINE (a child cannot notify us), and a
stop is SHUTDOWN NOSAVE, then SIGTERM, then SIGKILL, each with its own timeout.
"""
from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import time
from typing import Iterator, List, Optional

import pytest

import dma

START_DEADLINE = 30.0
STOP_DEADLINE = 10.0
BIND_ATTEMPTS = 5

HERE = pathlib.Path(__file__).resolve().parent


def module_path() -> str:
    path = os.environ.get("DMA_MODULE") or str(HERE.parent.parent / "build" / "lib" / "dma.so")
    if not os.path.exists(path):
        pytest.fail(f"no module at {path} (build it first, or set DMA_MODULE)")
    return path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def command(port: int, *arguments: bytes, timeout: float = 5.0) -> bytes:
    """One RESP command on a fresh connection; the reply's raw bytes (enough for PING, INFO)."""
    payload = b"*%d\r\n" % len(arguments) + b"".join(
        b"$%d\r\n%s\r\n" % (len(argument), argument) for argument in arguments)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(payload)
        return connection.recv(1 << 16)


class RedisServer:
    """A redis-server child with the module. Owns the process and its log."""

    def __init__(self, module_arguments: Optional[List[str]] = None,
                 provider: str = "tcp") -> None:
        self.module_arguments = module_arguments or []
        self.provider = provider
        self.process: Optional[subprocess.Popen] = None
        self.port = 0
        self.log_path = ""
        last_log = ""
        for _ in range(BIND_ATTEMPTS):
            self.port = free_port()
            self._spawn()
            if self._wait_ready():
                return
            last_log = self.log()
            self.stop()
            if "Address already in use" not in last_log:
                break
        raise RuntimeError(f"redis-server with the module did not start:\n{last_log}")

    def _spawn(self) -> None:
        handle, self.log_path = tempfile.mkstemp(prefix=f"dma-pytest-redis-{self.port}-",
                                                 suffix=".log")
        arguments = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                     "--save", "", "--appendonly", "no", "--loadmodule", module_path(),
                     "providers", self.provider, "bind", "127.0.0.1", *self.module_arguments]
        environment = dict(os.environ, IPATH_NO_BACKTRACE="1")
        self.process = subprocess.Popen(arguments, stdin=subprocess.DEVNULL, stdout=handle,
                                        stderr=subprocess.STDOUT, env=environment)
        os.close(handle)

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + START_DEADLINE
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                if command(self.port, b"PING", timeout=1.0).startswith(b"+PONG"):
                    return True
            except OSError:
                pass
            time.sleep(0.02)  # polling a child that cannot notify us, bounded by the deadline
        return False

    def log(self) -> str:
        try:
            return pathlib.Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL, no goodbye, and reaped."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=STOP_DEADLINE)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                command(self.port, b"SHUTDOWN", b"NOSAVE", timeout=STOP_DEADLINE / 2)
            except OSError:
                pass
            try:
                self.process.wait(timeout=STOP_DEADLINE / 2)
            except subprocess.TimeoutExpired:
                self.process.terminate()
                try:
                    self.process.wait(timeout=STOP_DEADLINE / 2)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
        if self.log_path:
            pathlib.Path(self.log_path).unlink(missing_ok=True)


def client_for(server: RedisServer, **options) -> dma.Client:
    options.setdefault("provider", server.provider)
    options.setdefault("bind", "127.0.0.1")
    options.setdefault("timeout", 30.0)
    return dma.Client("127.0.0.1", server.port, **options)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """One server for a test module's tests; each test uses keys of its own."""
    started = RedisServer()
    yield started
    log = started.log()
    started.stop()
    for report in ("crashed by signal", "ASSERTION FAILED", "Guru Meditation"):
        assert report not in log, f"redis-server reported a problem:\n{log}"


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server for one test (one it may kill)."""
    started = RedisServer()
    yield started
    started.stop()


@pytest.fixture
def client(server: RedisServer) -> Iterator[dma.Client]:
    with client_for(server) as opened:
        yield opened


def pattern(size: int, seed: int = 0) -> bytes:
    """`size` bytes that differ from one offset (and seed) to the next."""
    block = bytes((index * 131 + seed * 7 + 1) & 0xFF for index in range(251))
    return (block * (size // len(block) + 1))[:size]
