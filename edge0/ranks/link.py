"""The boundary exchange: fixed-size int32 messages between neighbouring ranks over
mx.distributed, on one thread so that every call can time out (docs/distributed.md).
"""

from __future__ import annotations

import concurrent.futures
import queue
import struct
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import mlx.core as mx
import numpy as np

from edge0.errors import RankError
from edge0.log import get_logger

log = get_logger("edge0.ranks.link")
T = TypeVar("T")

BEGIN, STEP, TOKEN, STATS, PING, STOP = 1, 2, 3, 4, 5, 6
KINDS = {BEGIN: "begin", STEP: "step", TOKEN: "token", STATS: "stats", PING: "ping", STOP: "stop"}
FIXED = 8  # kind, request, step, pos, prefill, token, n_pred, flags
GREEDY = 1  # flag: the last rank takes the argmax (a prompt step that does not draw)


@attrs.define
class Message:
    kind: int
    request: int = 0
    step: int = 0
    pos: int = 0
    prefill: bool = False
    token: int = -1
    pred: list[int] | None = None  # predicted experts of the receiver's first layer, next step
    payload: np.ndarray | None = None  # int32 words
    flags: int = 0


class Codec:
    """Packs messages for one model: `k` predicted experts, `words` payload words.

    Every message is one int32 array of `size` words: a header (kind, request, step,
    position, prefill flag, token, number of predicted experts, then the predicted experts
    of the receiving side's first layer) and a payload (the (1, 1, d) hidden state as int32
    words, exact for any dtype; or sampling settings; or per-rank stats). One size for every
    kind keeps `recv` simple.
    """

    def __init__(self, k: int, d_model: int, itemsize: int) -> None:
        self.k = k
        self.words = max(64, d_model * itemsize // 4)
        self.size = FIXED + k + self.words

    @property
    def nbytes(self) -> int:
        return 4 * self.size

    def pack(self, m: Message) -> np.ndarray:
        buf = np.zeros(self.size, dtype=np.int32)
        pred = m.pred or []
        buf[:FIXED] = (
            m.kind,
            m.request,
            m.step,
            m.pos,
            int(m.prefill),
            m.token,
            len(pred) if m.pred is not None else -1,
            m.flags,
        )
        buf[FIXED : FIXED + len(pred)] = pred
        if m.payload is not None:
            buf[FIXED + self.k : FIXED + self.k + m.payload.size] = m.payload
        return buf

    def unpack(self, buf: np.ndarray) -> Message:
        kind, request, step, pos, prefill, token, n_pred, flags = (int(v) for v in buf[:FIXED])
        pred = None if n_pred < 0 else [int(v) for v in buf[FIXED : FIXED + n_pred]]
        return Message(
            kind,
            request,
            step,
            pos,
            bool(prefill),
            token,
            pred,
            buf[FIXED + self.k :].copy(),
            flags,
        )


def hidden_words(h: mx.array) -> np.ndarray:
    """An evaluated hidden state as int32 words (bit-exact)."""
    return np.asarray(h.reshape(-1).view(mx.int32)).copy()


def words_hidden(words: np.ndarray, d_model: int, dtype: mx.Dtype) -> mx.array:
    n = d_model * dtype.size // 4
    return mx.array(words[:n]).view(dtype).reshape(1, 1, d_model)


def pack_floats(values: list[float]) -> np.ndarray:
    return np.frombuffer(struct.pack(f"<{len(values)}f", *values), dtype=np.int32).copy()


def unpack_floats(words: np.ndarray, n: int) -> list[float]:
    return list(struct.unpack(f"<{n}f", words[:n].astype(np.int32).tobytes()))


class Link:
    """This rank's end of the ring: `send(to, msg)` / `recv(src, timeout)` on the link thread.

    All transport runs on that one thread, in order, so a call can wait with a timeout: a
    peer that died shows as the ring backend's "connection to a peer was lost" (measured
    ~0.7 s after the peer exits), a peer that hangs only as the timeout (the ring backend
    has none of its own).
    """

    def __init__(self, codec: Codec, timeout_s: float) -> None:
        self.codec = codec
        self.timeout_s = timeout_s
        self.group: Any = None
        self.broken: RankError | None = None
        self.sent_bytes = 0
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="edge0-link", daemon=True)
        self._thread.start()

    # --- the link thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                mx.clear_streams()  # a thread that used MLX streams releases them (measured)
                return
            fn, fut = job
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                fut.set_exception(exc)

    def _submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        if self.broken is not None:
            raise self.broken
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, fut))
        return fut

    def _call(self, fn: Callable[[], T], what: str, timeout: float | None) -> T:
        return self.wait(self._submit(fn), what, timeout)

    def wait(self, fut: concurrent.futures.Future[T], what: str, timeout: float | None) -> T:
        """The result of a link job; RankError (and the link marked broken) on failure."""
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            self.broken = RankError(
                f"{what}: no answer within {timeout:g} s (a rank hangs or is overloaded); the "
                "request ends; restart the ranks (raise the timeout with --rank-timeout)"
            )
        except RuntimeError as exc:  # the ring backend: "[ring] connection to a peer was lost"
            self.broken = RankError(f"{what}: {exc}; a rank died; restart the ranks")
        log.error("rank_failed", error=str(self.broken))
        raise self.broken

    # --- API (any thread; callers wait) ----------------------------------------------------
    def start_init(self) -> concurrent.futures.Future[Any]:
        """Join the ring (MLX_RANK / MLX_HOSTFILE), on the link thread; `wait` for it."""

        def fn() -> Any:
            group = mx.distributed.init(strict=True, backend="ring")
            mx.eval(
                mx.distributed.all_sum(
                    mx.array([1.0], dtype=mx.float32), group=group, stream=mx.cpu
                )
            )
            self.group = group
            return group

        return self._submit(fn)

    def init(self, timeout: float, what: str) -> Any:
        return self.wait(self.start_init(), what, timeout)

    def start_recv(self, src: int) -> concurrent.futures.Future[Message]:
        size = self.codec.size

        def fn() -> Message:
            got = mx.distributed.recv((size,), mx.int32, src, group=self.group, stream=mx.cpu)
            mx.eval(got)
            return self.codec.unpack(np.array(got))

        return self._submit(fn)

    def send(self, dst: int, m: Message, what: str) -> None:
        buf = self.codec.pack(m)

        def fn() -> None:
            mx.eval(mx.distributed.send(mx.array(buf), dst, group=self.group, stream=mx.cpu))

        self.sent_bytes += buf.nbytes
        self._call(fn, what, self.timeout_s)

    def recv(self, src: int, what: str, timeout: float | None = -1.0) -> Message:
        wait = self.timeout_s if timeout is not None and timeout < 0 else timeout
        return self.wait(self.start_recv(src), what, wait)

    def close(self) -> None:
        """Stop the link thread (it stays blocked, as a daemon, if a recv never returns)."""
        self._jobs.put(None)
        if self.broken is None:
            self._thread.join(timeout=5)
