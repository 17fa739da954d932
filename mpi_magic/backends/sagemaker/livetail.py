"""A job's leader log as CloudWatch Logs Live Tail pushes it: one open response that brings the
lines ingested each second, instead of one GetLogEvents call per look.

Polling cannot be both cheap and quick: reading every T seconds makes a line wait T/2 on average,
so 30 calls a minute means a second's wait at least. A Live Tail stream is one call that brings
every line about a second after it was written, at $0.01 a minute of it (CloudWatch's price
list). It carries at most 500 lines a second (AWS samples above that) and needs the
``logs:StartLiveTail`` permission; the watch loop's own reads of the log, rarer while a stream
runs, bring whatever it misses, and ``Ledger`` passes each line on once whichever reader brings it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Any
from urllib.parse import urlsplit

AWS_HOSTS = (".amazonaws.com", ".amazonaws.com.cn", ".api.aws")
UNTAKEN_LIMIT = 30.0  # seconds without a take(): the watch loop is gone, so the stream (billed) ends
READ_AHEAD_KEPT = 60.0  # seconds a line read first waits for Live Tail's copy: AWS buffers 10 s of updates at most


def live_tail_client(clients, logs, config):
    """A CloudWatch Logs client for StartLiveTail. AWS routes it by a host prefix ("stream-logs.REGION...");
    an endpoint of the user's own (an emulator, a proxy) has no such host, so it gets none."""
    from botocore.config import Config

    host = urlsplit(logs.meta.endpoint_url).hostname or ""
    if not host.endswith(AWS_HOSTS):
        config = config.merge(Config(inject_host_prefix=False))
    return clients.client("logs", config=config)


class LiveTail:
    """Live Tail on one log stream, read by a thread: ``take()`` the lines it brought.

    ``ended`` says why it ended (refused, sampled, the connection dropped, three hours passed);
    an ended stream stays ended, and the watch loop reads the log itself again. A stream whose
    lines nobody takes for ``UNTAKEN_LIMIT`` seconds ends itself, however the watching stopped.
    """

    def __init__(self, client, log_group_arn: str, stream: str):
        self.opened = self._taken_at = time.monotonic()
        self.started = False  # AWS opened the stream: it brings every line ingested from now on
        self.ended: str | None = None
        self._lines: deque[tuple[int, str]] = deque()  # (timestamp, message), appended by the thread
        self._reply: Any = None  # botocore's EventStream, once StartLiveTail answered
        self._closing = False
        self._thread = threading.Thread(target=self._follow, args=(client, log_group_arn, stream),
                                        name=f"mpi_magic live tail {stream}", daemon=True)
        self._thread.start()

    def _follow(self, client, log_group_arn: str, stream: str) -> None:
        reason = "the stream ended"
        try:
            self._reply = client.start_live_tail(logGroupIdentifiers=[log_group_arn],
                                                 logStreamNames=[stream])["responseStream"]
            for item in self._reply:
                update = item.get("sessionUpdate")
                if update is None:
                    self.started = self.started or "sessionStart" in item
                    continue
                if update.get("sessionMetadata", {}).get("sampled"):  # its lines are not all there: none is taken,
                    reason = "more than 500 lines a second: Live Tail sampled them"  # reads bring them in order
                    break
                self._lines.extend((line["timestamp"], line["message"]) for line in update.get("sessionResults", ()))
                if self._closing or time.monotonic() - self._taken_at > UNTAKEN_LIMIT:
                    break
        except Exception as exc:  # noqa: BLE001 - refused, or the connection dropped: the loop reads the log itself
            reason = f"{type(exc).__name__}: {exc}"
        finally:
            self.ended = "closed" if self._closing else reason
            self._close_reply()

    def take(self) -> list[tuple[int, str]]:
        """The lines brought since the last call, in the order they came."""
        self._taken_at = time.monotonic()
        taken = []
        while self._lines:
            taken.append(self._lines.popleft())
        return taken

    def close(self) -> None:
        """End the stream without waiting: the thread's read in progress holds the connection until
        AWS's next update (a second), so the socket is shut for reading instead, which ends that read
        at once; the thread then closes the connection. Where urllib3 cannot (before 2.3), the thread
        notices at the next update."""
        self._closing = True
        shutdown = getattr(getattr(self._reply, "_raw_stream", None), "shutdown", None)  # botocore's EventStream
        if shutdown is not None:
            try:
                shutdown()
            except (OSError, ValueError, RuntimeError):  # already closed, or released
                pass

    def _close_reply(self) -> None:
        reply = self._reply
        if reply is not None:
            try:
                reply.close()
            except Exception:  # noqa: BLE001 - already closed by the other side
                pass


class Ledger:
    """Lines that two readers of one log stream bring, each passed on once, by the first to bring it.

    A line is known by its timestamp and text; repeats of one line are counted. A line read with
    GetLogEvents that Live Tail has not brought yet waits ``READ_AHEAD_KEPT`` seconds for its copy:
    Live Tail brings nothing ingested before its stream began, or that it sampled away.
    """

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._live_ahead: Counter[tuple[int, str]] = Counter()
        self._read_ahead: Counter[tuple[int, str]] = Counter()
        self._read_order: deque[tuple[float, tuple[int, str]]] = deque()

    def first_live(self, key: tuple[int, str]) -> bool:
        """Live Tail brought ``key``: is it new?"""
        self._forget_old()
        if self._read_ahead[key]:
            self._take(self._read_ahead, key)
            return False
        self._live_ahead[key] += 1
        return True

    def first_read(self, key: tuple[int, str], live: bool) -> bool:
        """GetLogEvents brought ``key``; ``live``: a Live Tail stream runs and may bring it too."""
        if self._live_ahead[key]:
            self._take(self._live_ahead, key)
            return False
        if live:
            self._read_ahead[key] += 1
            self._read_order.append((self.clock() + READ_AHEAD_KEPT, key))
        return True

    @staticmethod
    def _take(counts: Counter, key) -> None:
        counts[key] -= 1
        if counts[key] <= 0:
            del counts[key]

    def _forget_old(self) -> None:
        now = self.clock()
        while self._read_order and self._read_order[0][0] < now:
            _, key = self._read_order.popleft()
            if self._read_ahead[key]:  # still unmatched: Live Tail will not bring it now
                self._take(self._read_ahead, key)
