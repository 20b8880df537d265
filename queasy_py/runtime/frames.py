"""Framing of the pipe between the supervisor and a worker: each message is a 4-byte
big-endian length, then that many bytes: one orjson document, except a batch of jobs.

A batch of jobs (supervisor -> worker) is a 4-byte length, that many bytes of orjson
header ([[seq, queue, id, run_at, retry, stall, timeout, data_length], ...]), then the jobs'
data, as stored, one after the other. Job data is never parsed as part of the header: data
that is not JSON (written to Redis by anyone with the key layout) cannot break the framing
or reach another job; the worker decodes each job's data on its own.

The supervisor reads without blocking and takes every frame that has arrived in one go
(multiprocessing's Connection.poll() built a selector per call: a quarter of the loop's time
under load); the worker reads one frame at a time, blocking. Importing this costs next to
nothing, unlike multiprocessing.connection (a fifth of a worker's start).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from typing import Any

import orjson

HEAD = struct.Struct("!i")
#: the most bytes one recv of read_frames takes
RECV_SIZE = 1 << 18


def pack_jobs(heads: list[list[Any]], datas: Sequence[bytes]) -> bytes:
    """One batch of jobs: `heads[i]` ends with len(datas[i]), the raw data of job i."""
    header = orjson.dumps(heads)
    return b"".join([HEAD.pack(len(header)), header, *datas])


def job_heads(frame: bytes) -> tuple[list[list[Any]], int]:
    """The heads of a batch made by pack_jobs, and where the first job's data starts: job
    i's data is the next heads[i][-1] bytes (the worker slices them as it goes: cheaper than
    a generator of slices)."""
    (size,) = HEAD.unpack_from(frame)
    return orjson.loads(frame[HEAD.size : HEAD.size + size]), HEAD.size + size


class Pipe:
    """One end of the socketpair between the supervisor and a worker."""

    HEADER = HEAD

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.eof = False
        #: the supervisor's side never blocks on a send: what the socket does not take now
        #: waits in `out` until flush() finds the socket writable (a worker stuck in C code
        #: does not drain its pipe, and the loop must go on to kill it at its timeout)
        self.buffered = False
        self.out = bytearray()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send_frame(self, payload: bytes) -> None:
        data = self.HEADER.pack(len(payload)) + payload
        if not self.buffered:
            self.sock.sendall(data)
            return
        if not self.out:
            try:
                sent = self.sock.send(data, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        self.out += data

    def flush(self) -> None:
        """Send what waits in `out`, as much as the socket takes now (never blocks)."""
        while self.out:
            try:
                sent = self.sock.send(self.out, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            del self.out[:sent]

    def read_frames(self) -> list[bytes]:
        """Every complete frame that has arrived; sets `eof` when the worker closed its end."""
        while True:
            try:
                chunk = self.sock.recv(RECV_SIZE, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
                break
            self.buf += chunk
            if len(chunk) < RECV_SIZE:
                # the socket had no more (a stream gives all it holds, up to the size
                # asked): no second recv and its BlockingIOError. What arrives later, or
                # its end, makes the socket readable again for the loop's selector.
                break
        frames = []
        start, end = 0, len(self.buf)
        while end - start >= 4:
            (size,) = self.HEADER.unpack_from(self.buf, start)
            if end - start - 4 < size:
                break
            frames.append(bytes(self.buf[start + 4 : start + 4 + size]))
            start += 4 + size
        del self.buf[:start]
        return frames

    def recv_frame(self) -> bytes:
        """The next frame, waiting for it (the worker's side). EOFError once the other end
        is closed."""
        (size,) = self.HEADER.unpack(self._exactly(4))
        return self._exactly(size)

    def _exactly(self, size: int) -> bytes:
        while len(self.buf) < size:
            chunk = self.sock.recv(max(1 << 16, size - len(self.buf)))
            if not chunk:
                raise EOFError("the other end closed the pipe")
            self.buf += chunk
        out = bytes(self.buf[:size])
        del self.buf[:size]
        return out

    def close(self) -> None:
        self.sock.close()
