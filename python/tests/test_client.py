"""dma.Client against a real redis-server with the module: the buffer types a Python user has,
large values, missing keys, a buffer too small, a server SIGKILLed mid-GET, threads, asyncio,
last_checksum, and the buffer a GET that failed without its reply leaves to its server
(server_may_write). Each test opens with what breaks if it fails."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time

import numpy
import pytest

import dma
from conftest import RedisServer, client_for, pattern

MIB = 1 << 20


def test_the_package_imported_is_the_one_just_built() -> None:
    # Fails if the suite tests an older installed copy instead of this build's.
    built = os.environ.get("DMA_BUILD_PYTHON_DIR")
    if built:
        assert dma.__file__.startswith(os.path.abspath(built)), dma.__file__
    assert dma.__version__ == dma.version()


def test_bytes_set_then_get_returns_bytes(client: dma.Client) -> None:
    # Fails if the simplest round trip (bytes in, bytes out) loses or alters a byte.
    value = pattern(100_000, seed=1)
    client.set("bytes-key", value)
    got = client.get("bytes-key")
    assert isinstance(got, bytes)
    assert got == value
    assert client.length("bytes-key") == len(value)


def test_small_values_travel_inline_and_read_back(client: dma.Client) -> None:
    # Fails if values at or below inline_max (sent in the command and reply) differ from ones
    # that go over the fabric.
    assert client.inline_max > 0
    for size in (0, 1, client.inline_max, client.inline_max + 1):
        value = pattern(size, seed=size)
        client.set(b"inline-%d" % size, value)
        assert client.get(b"inline-%d" % size) == value
        landing = bytearray(size + 8)
        assert client.get(b"inline-%d" % size, out=landing) == size
        assert bytes(landing[:size]) == value


def test_bytearray_memoryview_and_numpy_buffers_are_used_in_place(client: dma.Client) -> None:
    # Fails if any common buffer type is refused, copied instead of filled, or filled wrongly.
    value = pattern(300_000, seed=2)
    client.set("buffers", bytearray(value))
    client.set("buffers-mv", memoryview(value))
    client.set("buffers-np", numpy.frombuffer(value, dtype=numpy.uint8))

    into = bytearray(len(value))
    assert client.get("buffers", out=into) == len(value)
    assert into == value

    backing = bytearray(len(value) + 100)
    view = memoryview(backing)[50:50 + len(value)]
    assert client.get("buffers-mv", out=view) == len(value)
    assert bytes(backing[50:50 + len(value)]) == value
    assert backing[:50] == bytes(50) and backing[-50:] == bytes(50)

    array = numpy.zeros(len(value) // 4, dtype=numpy.uint32)  # not a byte array: bytes count
    assert client.get("buffers-np", out=array) == len(value)
    assert array.tobytes() == value


def test_a_16_mib_value_round_trips_through_an_exposed_buffer(client: dma.Client) -> None:
    # Fails if a large value is cut, or if a buffer exposed once cannot be reused.
    value = numpy.frombuffer(pattern(16 * MIB, seed=3), dtype=numpy.uint8)
    source = client.expose(value)
    client.set("sixteen", source)
    landing = numpy.zeros(16 * MIB, dtype=numpy.uint8)
    with client.expose(landing) as exposed:
        for _ in range(3):
            landing[:] = 0
            assert client.get("sixteen", out=exposed) == 16 * MIB
            assert numpy.array_equal(landing, value)
    assert client.get("sixteen") == value.tobytes()
    source.close()


def test_the_expect_window_is_checked_and_either_setting_reads_a_value_right(
        server: RedisServer) -> None:
    # Fails if expect_window is not passed through (a negative or absurd one accepted), or a
    # client with the window off or long reads a DMA.GET's value wrong.
    for bad in (-1e-6, float("nan"), 1e9):
        with pytest.raises(ValueError, match="expect_window"):
            client_for(server, expect_window=bad)
    value = pattern(MIB, seed=9)
    for window in (0.0, 0.002):
        with client_for(server, expect_window=window) as client:
            client.set("windowed", value)
            landing = bytearray(MIB)
            assert client.get("windowed", out=landing) == MIB
            assert landing == value
    with pytest.raises(ValueError, match="poll_interval"):
        dma.Target(provider="tcp", bind="127.0.0.1", poll_interval=-1.0)


def test_a_buffer_is_writable_memory_that_values_go_into_and_out_of(client: dma.Client) -> None:
    # Fails if dma.Buffer's buffer protocol is read-only, the wrong length, or not the memory a
    # get() lands in; or if a huge-page Buffer breaks a transfer.
    value = pattern(3 * MIB + 5, seed=12)
    source = dma.Buffer(len(value))
    assert len(source) == len(value)
    assert source.huge_pages and source.mapped == 2 * dma.Buffer.HUGE_PAGE_BYTES
    assert bytes(memoryview(source)) == bytes(len(value))  # zeroed
    memoryview(source)[:] = value
    client.set("from-a-buffer", source)
    landing = dma.Buffer(len(value))
    assert client.get("from-a-buffer", out=landing) == len(value)
    assert bytes(memoryview(landing)) == value
    as_array = numpy.frombuffer(landing, dtype=numpy.uint8)
    assert as_array.nbytes == len(value) and as_array[0] == value[0]
    with client.expose(landing) as exposed:
        memoryview(landing)[:] = bytes(len(value))
        assert client.get("from-a-buffer", out=exposed) == len(value)
        assert bytes(memoryview(landing)) == value

    small = dma.Buffer(100, huge_pages=dma.HugePages.NEVER)
    assert len(small) == 100 and small.mapped == 4096 and not small.huge_pages
    with pytest.raises(dma.InvalidArgumentError):
        dma.Buffer(0)
    with pytest.raises(dma.ResourceExhaustedError, match=str(1 << 50)):
        dma.Buffer(1 << 50)


def test_a_missing_key_is_none(client: dma.Client) -> None:
    # Fails if a key that does not exist reads as an empty value or raises.
    assert client.get("no-such-key") is None
    assert client.get("no-such-key", out=bytearray(10)) is None
    assert client.length("no-such-key") is None


def test_a_buffer_too_small_raises_naming_both_sizes_and_writes_nothing(client: dma.Client) -> None:
    # Fails if a short buffer is overrun or partly filled, or the error hides the sizes.
    value = pattern(200_000, seed=4)
    client.set("too-big", value)
    for size in (100, 150_000):  # inline-sized and fabric-sized buffers
        buffer = bytearray(b"\xee" * size)
        with pytest.raises(dma.InvalidArgumentError) as raised:
            client.get("too-big", out=buffer)
        assert raised.value.kind == dma.ErrorKind.INVALID_ARGUMENT
        assert str(len(value)) in str(raised.value) and str(size) in str(raised.value)
        assert buffer == b"\xee" * size


def test_a_read_only_buffer_is_refused_as_a_get_destination(client: dma.Client) -> None:
    # Fails if get() writes into immutable bytes.
    client.set("ro", b"x" * 10)
    with pytest.raises(BufferError):
        client.get("ro", out=b"\0" * 10)


def test_an_exposed_buffer_cannot_be_resized_while_exposed(client: dma.Client) -> None:
    # Fails if Python could free or move memory the server may write into.
    buffer = bytearray(1 << 16)
    exposed = client.expose(buffer)
    with pytest.raises(BufferError):
        buffer.extend(b"more")
    exposed.close()
    buffer.extend(b"more")


def test_errors_carry_the_kind_and_the_message() -> None:
    # Fails if a connection failure is not an UnreachableError (and ConnectionError) with kind.
    with pytest.raises(dma.UnreachableError) as raised:
        dma.Client("127.0.0.1", 1, provider="tcp", bind="127.0.0.1", timeout=5.0)
    assert isinstance(raised.value, ConnectionError)
    assert isinstance(raised.value, dma.Error)
    assert raised.value.kind == dma.ErrorKind.UNREACHABLE
    assert "127.0.0.1:1" in raised.value.message


def test_a_server_sigkilled_mid_get_raises_within_the_deadline(own_server: RedisServer) -> None:
    # Fails if a client waiting on a GET hangs (or crashes) when its server dies.
    timeout = 5.0
    client = client_for(own_server, timeout=timeout)
    value = pattern(16 * MIB, seed=5)
    client.set("dying", value)
    landing = bytearray(16 * MIB)
    done = threading.Event()
    outcome: dict = {}

    def reader() -> None:
        try:
            while True:
                client.get("dying", out=landing)
                done.set()  # at least one GET completed: the next one is on its way
        except dma.Error as error:
            outcome["error"] = error
            outcome["at"] = time.monotonic()
        finally:
            done.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert done.wait(timeout=30), "no GET completed"
    killed_at = time.monotonic()
    own_server.kill()
    thread.join(timeout=timeout + 10)
    assert not thread.is_alive(), "the GET hung after its server was killed"
    assert "error" in outcome
    assert outcome["at"] - killed_at < timeout + 1
    assert isinstance(outcome["error"], dma.UnreachableError), repr(outcome["error"])
    client.close()


def test_several_threads_each_with_its_own_client(server: RedisServer) -> None:
    # Fails if clients in different threads interfere, or a call holds the GIL throughout.
    errors: list = []

    def work(index: int) -> None:
        try:
            with client_for(server) as mine:
                for round_ in range(20):
                    value = pattern(64 * 1024 + index * 1000 + round_, seed=index)
                    mine.set(f"thread-{index}", value)
                    landing = bytearray(len(value))
                    assert mine.get(f"thread-{index}", out=landing) == len(value)
                    assert landing == value
        except BaseException as error:  # noqa: BLE001: reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()
    assert not errors, errors


def test_one_client_shared_by_threads_serialises_its_calls(client: dma.Client) -> None:
    # Fails if concurrent calls on one client corrupt its single connection.
    value = pattern(50_000, seed=6)
    client.set("shared", value)
    failures: list = []

    def reader() -> None:
        for _ in range(25):
            if client.get("shared") != value:
                failures.append("mismatch")

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures


def test_asyncio_many_concurrent_gets(server: RedisServer) -> None:
    # Fails if concurrent awaits lose, mix up or hang their results.
    values = {f"async-{index}": pattern(20_000 + index * 517, seed=index) for index in range(16)}

    async def main() -> None:
        with dma.ClientPool("127.0.0.1", server.port, size=3, provider="tcp",
                            bind="127.0.0.1", timeout=30.0) as pool:
            await asyncio.gather(*(pool.set_async(key, value) for key, value in values.items()))
            keys = list(values) * 8
            buffers = [bytearray(len(values[key])) for key in keys]
            lengths = await asyncio.wait_for(
                asyncio.gather(*(pool.get_async(key, buffer) for key, buffer in zip(keys, buffers))),
                timeout=120)
            for key, buffer, length in zip(keys, buffers, lengths):
                assert length == len(values[key]) and buffer == values[key]
            got = await asyncio.wait_for(
                asyncio.gather(*(pool.get_async(key) for key in keys)), timeout=120)
            assert got == [values[key] for key in keys]
            assert await pool.get_async("async-missing") is None

    asyncio.run(main())


def test_cancelling_an_async_get_keeps_the_buffer_until_the_call_returns(client: dma.Client) -> None:
    # Fails if a cancelled GET lets its buffer be resized or freed while the transfer may still
    # write into it, or if the client is unusable afterwards.
    value = pattern(16 * MIB, seed=7)
    client.set("cancelled", value)

    async def main() -> None:
        buffers = [bytearray(16 * MIB) for _ in range(4)]
        tasks = [asyncio.ensure_future(client.get_async("cancelled", out=buffer))
                 for buffer in buffers]
        await asyncio.sleep(0)  # let the tasks submit their calls: not a synchronisation
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert any(isinstance(result, asyncio.CancelledError) for result in results)
        # Whatever was started still holds its buffer's export until it returns ...
        await asyncio.wait_for(client.drain(), timeout=60)
        # ... and after drain() every buffer is the caller's again.
        for buffer in buffers:
            buffer.extend(b"!")
        assert await client.get_async("cancelled") == value

    asyncio.run(main())


def test_last_checksum_is_the_crc32c_of_the_value_the_last_get_returned(server: RedisServer) -> None:
    # Fails if last_checksum is not None before any get, is not the value's CRC32C after a get
    # by any path (get(key), out=buffer, out=Exposed; inline or over the fabric), or survives a
    # get that found no key or failed.
    with client_for(server) as fresh:
        assert fresh.last_checksum is None
        landing = bytearray(MIB + 8)
        exposed = fresh.expose(landing)
        for size in (10, fresh.inline_max + 1, MIB):
            value = pattern(size, seed=size % 251 + 9)
            key = f"checksum-{size}"
            fresh.set(key, value)
            expected = dma.crc32c(value)
            ways = {
                "get(key)": lambda: fresh.get(key) == value,
                "out=bytearray": lambda: fresh.get(key, out=bytearray(size + 8)) == size,
                "out=Exposed": lambda: (fresh.get(key, out=exposed) == size
                                        and landing[:size] == value),
            }
            for way, read in ways.items():
                # A GET that finds no key clears it, so each read below must set it itself.
                assert fresh.get("checksum-missing") is None
                assert fresh.last_checksum is None, way
                assert read(), way
                assert fresh.last_checksum == expected, (way, size)
            with pytest.raises(dma.InvalidArgumentError):
                fresh.get(key, out=bytearray(size - 1))  # too small: a failed GET
            assert fresh.last_checksum is None, size
        exposed.close()
    with pytest.raises(ValueError):
        fresh.last_checksum  # noqa: B018: a closed client


def test_server_may_write_is_false_for_a_fresh_buffer_and_after_a_successful_get(
        client: dma.Client) -> None:
    # Fails if server_may_write refuses a buffer type get() takes, or says a server may write
    # into memory no failed GET left to it.
    value = pattern(200_000, seed=10)
    client.set("may-write", value)
    buffers = [bytearray(len(value)), memoryview(bytearray(len(value))),
               numpy.zeros(len(value), dtype=numpy.uint8)]
    exposed = client.expose(bytearray(len(value)))
    for buffer in [*buffers, exposed, b"read-only bytes"]:
        assert client.server_may_write(buffer) is False, type(buffer)
    for buffer in [*buffers, exposed]:
        assert client.get("may-write", out=buffer) == len(value)
        assert client.server_may_write(buffer) is False, type(buffer)
    assert bytes(exposed.obj) == value and all(bytes(buffer) == value for buffer in buffers)
    exposed.close()
    with pytest.raises(TypeError):
        client.server_may_write(12)  # not a buffer


@pytest.mark.parametrize("provider", ["tcp", "shm"])
def test_a_get_that_fails_without_its_reply_keeps_its_buffer_while_the_server_may_write(
        provider: str) -> None:
    # Fails if Python can resize or free a buffer (given as such or through an Exposed, even
    # once that is closed) that a server may still write into after a GET into it failed, if
    # server_may_write does not say so, or if the binding never lets the buffer go (shm: when
    # the server has exited; tcp: when the Client, and every Exposed on it, is gone).
    server = RedisServer(["completion-deadline-ms", "5000"], provider=provider)
    stopped = False
    try:
        plain = client_for(server, timeout=1.0)
        through_exposed = client_for(server, timeout=1.0)
        value = pattern(MIB, seed=11)
        plain.set("left", value)
        landing = bytearray(b"\xab" * MIB)  # over inline_max: the server writes it
        exposed_landing = bytearray(MIB)
        exposed = through_exposed.expose(exposed_landing)
        assert plain.server_may_write(landing) is False
        assert through_exposed.server_may_write(exposed) is False
        references = sys.getrefcount(landing)

        os.kill(server.process.pid, signal.SIGSTOP)  # the GETs wait, unread, on its socket
        stopped = True
        with pytest.raises(dma.UnreachableError):
            plain.get("left", out=landing)
        with pytest.raises(dma.UnreachableError):
            through_exposed.get("left", out=exposed)

        assert sys.getrefcount(landing) == references + 1, "the failed GET's buffer is not held"
        with pytest.raises(BufferError):
            landing.extend(b"!")
        assert plain.server_may_write(landing) is True
        assert plain.last_checksum is None
        # Refused (the server may write there), and no second hold for it.
        with pytest.raises(dma.InvalidArgumentError):
            plain.get("left", out=landing)
        assert sys.getrefcount(landing) == references + 1
        assert plain.server_may_write(memoryview(landing)[100:200]) is True
        assert plain.server_may_write(bytearray(MIB)) is False
        assert plain.server_may_write(exposed_landing) is False  # the other client's

        assert through_exposed.server_may_write(exposed) is True
        assert through_exposed.server_may_write(exposed_landing) is True
        exposed.close()  # the registration goes; the memory stays held
        with pytest.raises(BufferError):
            exposed_landing.extend(b"!")

        server.kill()
        stopped = False
        if provider == "shm":
            # The server's process has exited: nothing of it can land any more, and asking
            # lets the buffers go while the clients live.
            assert plain.server_may_write(landing) is False
            assert sys.getrefcount(landing) == references
            landing.extend(b"!")
            assert through_exposed.server_may_write(exposed_landing) is False
            exposed_landing.extend(b"!")
        else:
            # On tcp only closing the client's target ends what may still land.
            assert plain.server_may_write(landing) is True
            with pytest.raises(BufferError):
                landing.extend(b"!")
            keeping = plain.expose(bytearray(10))  # shares the client's state
            plain.close()
            with pytest.raises(BufferError):
                landing.extend(b"!")
            keeping.close()
            del keeping  # the last owner of the client: its target closes, then the hold goes
            assert sys.getrefcount(landing) == references
            landing.extend(b"!")
            through_exposed.close()
            with pytest.raises(BufferError):  # its closed Exposed still owns the client
                exposed_landing.extend(b"!")
            del exposed
            exposed_landing.extend(b"!")
        plain.close()
        through_exposed.close()
    finally:
        if stopped and server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def test_target_exposes_memory_for_the_lower_level(client: dma.Client) -> None:
    # Fails if dma.Target cannot open or expose, or its advertisement is not the wire form.
    target = dma.Target(provider="tcp", bind="127.0.0.1")
    assert target.describe()["provider"].startswith("tcp")
    buffer = bytearray(4096)
    with target.expose(buffer) as exposed:
        fields = exposed.advertisement.split(" ")
        assert len(fields) == 3 and int(fields[1]) == exposed.key
        assert bytes.fromhex(fields[0]) == target.local_address
        assert exposed.length == 4096
        with pytest.raises(ValueError):
            client.get("anything", out=exposed)  # an Exposed of another target
    with target.busy():
        target.synchronize()
    assert dma.crc32c(b"123456789") == 0xE3069283
