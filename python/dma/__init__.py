"""dma: values moved by one-sided RDMA from a Redis/Valkey server running the dma module.

    import dma
    with dma.Client("127.0.0.1", 6379, provider="tcp", bind="127.0.0.1") as client:
        client.set("key", b"value")            # any readable buffer
        value = client.get("key")              # bytes, or None if there is no such key
        buffer = bytearray(1 << 20)
        n = client.get("key", out=buffer)      # into any writable buffer, no copy in Python
        exposed = client.expose(buffer)        # registered once, reused by every call
        n = client.get("key", out=exposed)

Every call releases the GIL for its whole duration. A Client may be shared between threads (its
calls are serialised: one connection), but one Client per thread runs them in parallel.

asyncio: ``await client.get_async(...)`` (and ``set_async``, ``length_async``) runs the blocking
call on the client's own worker thread, one call at a time, in submission order. Cancelling the
awaiting task stops the wait, not the transfer: a call that has started runs to its end, and
until it returns it keeps the buffer exported (a bytearray cannot be resized, no object's memory
can be freed) while the server may still write into it; a call that has not started yet never
will. ``await client.drain()`` returns once every call submitted before it has finished, after
which a buffer given to a cancelled call is the caller's again. ``ClientPool`` spreads calls over
several clients to run them concurrently.

``dma.Buffer(length)`` is memory made for values that cross the fabric (zeroed, its own mapping,
on 2 MiB huge pages from 1 MiB): a DMA.SET's value is copied out of it, and a DMA.GET lands in
it, faster than out of a bytearray (README, "Client memory").

``client.last_checksum`` is the CRC32C the last ``get`` checked its value against (None before
any, and after one that failed or found no key). A ``get`` that fails without its reply
(UnreachableError) leaves its buffer to the server, which may still write into it:
``client.server_may_write(buffer)`` says so, and the client keeps that buffer exported until it
says False or the client is gone.

Errors are ``dma.Error`` subclasses, one per ``dma.ErrorKind``, with ``.kind`` and ``.message``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import threading
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

from . import _dma
from ._dma import (  # noqa: F401  (re-exported)
    DEFAULT_INLINE_MAX,
    Buffer,
    Busy,
    ConfigurationError,
    CorruptedError,
    Error,
    ErrorKind,
    Exposed,
    FabricError,
    HugePages,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    Target,
    TimedOutError,
    UnreachableError,
    WorkerGoneError,
    crc32c,
    version,
)

__version__: str = _dma.__version__
__all__ = [
    "Client", "ClientPool", "Target", "Exposed", "Busy", "Buffer", "HugePages", "Error", "ErrorKind",
    "InvalidArgumentError", "ConfigurationError", "FabricError", "UnreachableError",
    "TimedOutError", "WorkerGoneError", "NotFoundError", "ResourceExhaustedError",
    "CorruptedError", "crc32c", "version", "DEFAULT_INLINE_MAX",
]

Key = Union[str, bytes, bytearray, memoryview]
_T = TypeVar("_T")


class Client(_dma.Client):
    """dma::Client: connects, says DMA.HELLO (proving its fabric address), then GETs and SETs.

    Client(host="127.0.0.1", port=6379, *, provider=None, providers=None, interfaces=None,
           bind=None, timeout=60.0, busy_poll=False, expect_window=300e-6, inline_max=None,
           config=None, hello=True)

    ``provider``/``providers`` must match the server's (default "tcp"); ``config`` is a TOML file
    (dma::Configuration::load) the other arguments override; ``timeout`` (seconds) bounds every
    round trip, the transfer included. ``expect_window`` (seconds, 0 = off) is how long the
    client's target polls after a command whose transfer its own progress serves is sent
    (dma::Client::Options): a DMA.GET's write on shm, whose copy then runs at once instead of
    after the target's next wake-up, and a DMA.SET's read on tcp and net.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._executor_lock = threading.Lock()
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def _worker(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._executor_lock:
            if self._executor is None:
                # One thread: the calls are serialised by the client anyway, and in order.
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="dma-client")
            return self._executor

    async def _run(self, call: Callable[..., _T], *args: Any) -> _T:
        # The partial holds the arguments (the buffer included) until the call has returned,
        # whatever happens to the awaiting task.
        future = self._worker().submit(functools.partial(call, *args))
        return await asyncio.wrap_future(future)

    async def get_async(self, key: Key, out: Any = None) -> Any:
        """``get`` on the client's worker thread: bytes or None, or with ``out`` a length or None."""
        return await self._run(self.get, key, out)

    async def set_async(self, key: Key, value: Any, length: Optional[int] = None) -> None:
        """``set`` on the client's worker thread."""
        await self._run(self.set, key, value, length)

    async def length_async(self, key: Key) -> Optional[int]:
        """``length`` on the client's worker thread."""
        return await self._run(self.length, key)

    async def drain(self) -> None:
        """Returns once every call submitted before it (cancelled ones included) has finished."""
        await self._run(lambda: None)

    def close(self) -> None:
        """Waits for calls in progress, then closes; idempotent. Exposed buffers stay valid
        until closed themselves, but no call can use them any more."""
        with self._executor_lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        super().close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ClientPool:
    """Several Clients to one server, so asyncio calls run concurrently: each call goes to the
    client with the fewest calls waiting (ties in turn). Each client keeps its own connection,
    target and worker thread; an Exposed belongs to one client, so pass buffers, not Exposed.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 6379, size: int = 4,
                 **options: Any) -> None:
        if size < 1:
            raise ValueError("a ClientPool needs at least one client")
        self.clients: Sequence[Client] = []
        try:
            self.clients = [Client(host, port, **options) for _ in range(size)]
        except BaseException:
            for client in self.clients:
                client.close()
            raise
        self._waiting = [0] * size
        self._turn = itertools.count()

    def _pick(self) -> int:
        start = next(self._turn) % len(self.clients)
        order = [(index + start) % len(self.clients) for index in range(len(self.clients))]
        return min(order, key=lambda index: self._waiting[index])

    async def _call(self, name: str, *args: Any) -> Any:
        index = self._pick()
        self._waiting[index] += 1
        try:
            return await getattr(self.clients[index], name)(*args)
        finally:
            self._waiting[index] -= 1

    async def get_async(self, key: Key, out: Any = None) -> Any:
        return await self._call("get_async", key, out)

    async def set_async(self, key: Key, value: Any, length: Optional[int] = None) -> None:
        await self._call("set_async", key, value, length)

    async def length_async(self, key: Key) -> Optional[int]:
        return await self._call("length_async", key)

    async def drain(self) -> None:
        await asyncio.gather(*(client.drain() for client in self.clients))

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def __enter__(self) -> "ClientPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
