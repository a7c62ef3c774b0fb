"""vLLM-compatible KV event publisher: ZMQ PUB + replay ROUTER (the interface and the null
publisher are in :mod:`publisher.base`).

Wire behaviour follows vLLM 0.33's ``ZmqEventPublisher`` byte for byte (proved by the
golden frames in ``tests/fixtures/vllm-0.33/frames``):

* PUB frames ``[topic, seq (8-byte big-endian unsigned, from 0 per instance), payload]``;
* replay: a client (DEALER) sends ``[b"", start_seq]``; the ROUTER answers every buffered
  batch with ``seq >= start_seq`` as ``[b"", topic, seq, payload]`` and then the end
  marker ``[b"", b"", -1 (8-byte signed big-endian), b""]``. ``start_seq`` is 8 bytes by
  protocol; as in vLLM, any length is read as unsigned big-endian and answered.

Differences from vLLM, all on the caller's side: ``publish`` never blocks (a full queue
is counted in ``dropped`` instead of waiting), publishing after ``shutdown`` is counted
as dropped instead of raising, ``shutdown`` lets ZMQ flush the last frames (linger)
instead of discarding them, and a batch that fails to encode uses no seq (vLLM spends
one, leaving a gap no replay can fill).

Threading: the ZMQ sockets are created, used and closed by the publisher thread only;
callers touch a thread-safe queue, a lock-protected counter and a wake-up socket pair.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import socket
import threading
import time
from collections import deque

import zmq

from publisher.base import EventPublisher
from publisher.endpoints import PUBLISH_MODES, bind, offset_endpoint_port, publisher_binds
from schemas import REPLAY_END_SEQ, KVEventBatch, encode_batch

log = logging.getLogger(__name__)

# Most replay requests one wake-up serves before live publishing gets its turn again.
_REPLAY_REQUESTS_PER_TURN = 16
# Most batches sent per turn, so replay requests are not starved by a busy queue.
_SENDS_PER_TURN = 1024
# Upper bound on one poll; wake-ups normally come from the socket pair long before.
_POLL_MS = 500
# A repeating fault (drops, malformed replay requests) is logged at most this often.
LOG_INTERVAL_S = 60.0


class ZmqEventPublisher(EventPublisher):
    """PUB socket with a bounded replay buffer served on an optional ROUTER socket.

    ``endpoint``/``replay_endpoint`` are offset by ``data_parallel_rank`` (see
    ``publisher.endpoints``); after start-up ``bound_endpoint`` and
    ``bound_replay_endpoint`` hold the concrete addresses (useful with ``tcp://host:*``).
    With ``start=False`` nothing is opened until ``start()``; batches published before
    that wait in the queue (or are dropped when it is full). ``mode`` says whether the
    PUB socket binds or connects: ``auto`` (vLLM's rule), ``bind`` or ``connect``.
    """

    def __init__(
        self,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        topic: str = "",
        data_parallel_rank: int = 0,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        *,
        context: zmq.Context | None = None,
        start: bool = True,
        mode: str = "auto",
    ) -> None:
        super().__init__(data_parallel_rank)
        if buffer_steps < 1 or max_queue_size < 1 or hwm < 0:
            raise ValueError("buffer_steps and max_queue_size must be >= 1, hwm >= 0")
        if mode not in PUBLISH_MODES:
            raise ValueError(f"unknown publish mode {mode!r}: expected one of {PUBLISH_MODES}")
        self.mode = mode
        self.endpoint: str = offset_endpoint_port(endpoint, data_parallel_rank) or endpoint
        self.replay_endpoint = offset_endpoint_port(replay_endpoint, data_parallel_rank)
        self.topic = topic
        self.hwm = hwm
        self.bound_endpoint: str | None = None
        self.bound_replay_endpoint: str | None = None
        self.replay_requests = 0
        self.bad_replay_requests = 0
        self.encode_errors = 0

        self._topic_bytes = topic.encode("utf-8")
        self._ctx = context if context is not None else zmq.Context.instance()
        self._queue: queue.Queue[KVEventBatch] = queue.Queue(maxsize=max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = itertools.count()
        self._drop_lock = threading.Lock()
        self._logged_at: dict[str, float] = {}  # per fault kind, when last logged
        self._closed = False  # publish() stops queueing
        self._shut_down = False  # shutdown() was called
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._flush_deadline = 0.0
        # Set by the thread just before it sleeps; publish() wakes it only then.
        self._idle = False
        self._taking = 0  # 1 while the thread holds a batch it took from the queue
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(
            target=self._run, name=f"kv-publisher-dp{data_parallel_rank}", daemon=True
        )
        if start:
            self.start()

    # ----------------------------------------------------------------- caller side
    def start(self, timeout: float = 10.0) -> None:
        """Open the sockets on the publisher thread; raise what binding/connecting raised."""
        if self._shut_down:
            raise RuntimeError("publisher was shut down")
        if self._thread.is_alive() or self._ready.is_set():
            return
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("publisher thread did not start")
        if self._startup_error is not None:
            self._closed = True
            self._close_wake()
            raise self._startup_error

    def publish(self, batch: KVEventBatch) -> None:
        """Queue ``batch``; a full queue or a closed publisher counts it as dropped.

        As in vLLM, a batch without ``data_parallel_rank`` is stamped with this
        publisher's rank (the batch object is modified).
        """
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = self.data_parallel_rank
        if self._closed:
            self._count_dropped(1, "publish() after shutdown()")
            return
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._count_dropped(1, "publisher queue full")
            return
        if self._idle:
            self._wake()

    def shutdown(self, timeout: float = 1.0) -> None:
        """Send what is queued (for at most ``timeout`` s), then close the sockets.

        Batches still queued at the deadline are counted as dropped. Idempotent.
        """
        if self._shut_down:
            return
        self._shut_down = self._closed = True
        if self._thread.is_alive():
            self._flush_deadline = time.monotonic() + timeout
            self._stopping.set()
            self._wake()
            self._thread.join(timeout + 1.0)
            if self._thread.is_alive():
                log.warning("KV event publisher thread did not stop within %.1fs", timeout)
                return
        # Whatever is still queued (never started, or a publish() racing this call).
        self._discard_queued("publisher shut down")
        self._close_wake()

    @property
    def queued(self) -> int:
        """Batches accepted and not yet published or dropped: the queue plus the one the
        thread has taken and is sending (without it, a reader that sees an empty queue
        and the old ``published`` would think everything was out)."""
        return self._queue.qsize() + self._taking

    def counters(self) -> dict[str, int]:
        queued = self.queued  # read before ``published``: together they never undercount
        return {
            "published": self.published,
            "dropped": self.dropped,
            "queued": queued,
            "replay_requests": self.replay_requests,
            "bad_replay_requests": self.bad_replay_requests,
            "encode_errors": self.encode_errors,
        }

    def _count_dropped(self, n: int, why: str) -> None:
        if n <= 0:
            return
        with self._drop_lock:
            self.dropped += n
            total = self.dropped
        self._log_limited("dropped", "KV event batches dropped (%s); %d so far", why, total)

    def _log_limited(self, key: str, msg: str, *args: object, exc_info: bool = False) -> None:
        """A repeating fault stays visible: logged at once, then at most once per
        ``LOG_INTERVAL_S`` with the running count (never "once per process")."""
        now = time.monotonic()
        with self._drop_lock:
            last = self._logged_at.get(key)
            if last is not None and now - last < LOG_INTERVAL_S:
                return
            self._logged_at[key] = now
        log.warning(msg, *args, exc_info=exc_info)

    def _discard_queued(self, why: str) -> None:
        n = 0
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            n += 1
        self._count_dropped(n, why)

    def _wake(self) -> None:
        # A full pipe means a wake-up is already pending; a closed one means shut down.
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _close_wake(self) -> None:
        self._wake_r.close()
        self._wake_w.close()

    # ----------------------------------------------------------- publisher thread
    def _run(self) -> None:
        try:
            pub, replay = self._open_sockets()
        except BaseException as exc:  # surfaced to start() in the caller's thread
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop(pub, replay)
        except Exception:  # never let a bug kill the engine; count the rest as dropped
            log.exception("KV event publisher thread failed")
            self._closed = True
        finally:
            self._finish(pub, replay)

    def _open_sockets(self) -> tuple[zmq.Socket, zmq.Socket | None]:
        pub = self._ctx.socket(zmq.PUB)
        replay: zmq.Socket | None = None
        try:
            pub.set_hwm(self.hwm)
            if publisher_binds(self.endpoint, self.mode):
                self.bound_endpoint = bind(pub, self.endpoint)
            else:
                pub.connect(self.endpoint)
                self.bound_endpoint = self.endpoint
            if self.replay_endpoint is not None:
                replay = self._ctx.socket(zmq.ROUTER)
                # As vLLM: room for two full replays plus markers, since ZMQ acks reads
                # only every HWM/2 messages (a ROUTER at its HWM silently drops frames).
                replay_hwm = 2 * ((self._buffer.maxlen or 0) + 1)
                replay.setsockopt(zmq.SNDHWM, max(self.hwm, replay_hwm))
                self.bound_replay_endpoint = bind(replay, self.replay_endpoint)
        except BaseException:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)
            raise
        return pub, replay

    def _loop(self, pub: zmq.Socket, replay: zmq.Socket | None) -> None:
        poller = zmq.Poller()
        wake_fd = self._wake_r.fileno()
        poller.register(wake_fd, zmq.POLLIN)
        if replay is not None:
            poller.register(replay, zmq.POLLIN)
        while not self._stopping.is_set():
            # Announce the sleep before checking the queue, so a batch queued after the
            # check always finds _idle set and writes a wake-up byte.
            self._idle = True
            timeout = 0 if not self._queue.empty() else _POLL_MS
            ready = dict(poller.poll(timeout))
            self._idle = False
            if wake_fd in ready:
                self._drain_wake()
            if replay is not None and replay in ready:
                try:
                    self._serve_replay(replay)
                except Exception:  # replay is best effort; live publishing must go on
                    log.exception("KV event replay failed")
            self._send_queued(pub, _SENDS_PER_TURN, None)

    def _finish(self, pub: zmq.Socket, replay: zmq.Socket | None) -> None:
        deadline = self._flush_deadline or time.monotonic()
        if self._stopping.is_set():
            self._send_queued(pub, None, deadline)
        self._discard_queued("shutdown deadline reached")
        # Linger so frames already handed to ZMQ still reach subscribers after close.
        linger_ms = max(0, int((deadline - time.monotonic()) * 1000))
        pub.close(linger=linger_ms)
        if replay is not None:
            replay.close(linger=0)

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass

    def _send_queued(self, pub: zmq.Socket, limit: int | None, deadline: float | None) -> None:
        sent = 0
        try:
            while limit is None or sent < limit:
                if deadline is not None and time.monotonic() > deadline:
                    return
                self._taking = 1  # before the queue shrinks, cleared once it is counted
                try:
                    batch = self._queue.get_nowait()
                except queue.Empty:
                    return
                self._settle(pub, batch)
                sent += 1
        finally:
            self._taking = 0

    def _settle(self, pub: zmq.Socket, batch: KVEventBatch) -> None:
        """Encode and send one taken batch; counted as published or dropped, then the
        next is taken (``_taking`` stays 1 until the count is in)."""
        try:
            payload = encode_batch(batch)
        except Exception:  # a caller handed us something that is not a batch
            self.encode_errors += 1
            self._log_limited(
                "encode",
                "KV event batch failed to encode; %d so far",
                self.encode_errors,
                exc_info=True,
            )
            self._count_dropped(1, "batch failed to encode")
            self._taking = 0
            return
        seq = next(self._seq)
        pub.send_multipart((self._topic_bytes, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        self.published += 1
        self._taking = 0

    def _serve_replay(self, replay: zmq.Socket) -> None:
        for _ in range(_REPLAY_REQUESTS_PER_TURN):
            try:
                frames = replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3:
                self.bad_replay_requests += 1
                self._log_limited(
                    "bad_replay",
                    "ignoring malformed replay request (%d frames); %d so far",
                    len(frames),
                    self.bad_replay_requests,
                )
                continue
            self.replay_requests += 1
            # As vLLM: start_seq is unsigned big-endian of any length (8 bytes by protocol).
            digits = frames[2].lstrip(b"\0")
            start_seq = int.from_bytes(digits, "big") if len(digits) <= 8 else 1 << 64
            identity = frames[0]
            for seq, payload in self._buffered_from(start_seq):
                replay.send_multipart(
                    (identity, b"", self._topic_bytes, seq.to_bytes(8, "big"), payload)
                )
            replay.send_multipart((identity, b"", b"", REPLAY_END_SEQ, b""))

    def _buffered_from(self, start_seq: int) -> itertools.islice[tuple[int, bytes]]:
        """Buffered (seq, payload) with seq >= start_seq; seqs in the buffer are contiguous."""
        if not self._buffer:
            return itertools.islice((), 0)
        skip = min(max(0, start_seq - self._buffer[0][0]), len(self._buffer))
        return itertools.islice(self._buffer, skip, None)
