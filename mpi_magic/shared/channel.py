"""How the notebook hands cells to a session's rank 0: one JSON message per line.

A message is small (what to run and where its payload lies); values travel in payload files.
Locally the channel is a Unix socket in a private folder (0700) that accepts exactly one
connection, rank 0's, which must present the session's secret first; then the socket file is
removed, so nothing else can connect. Another transport (a cloud store) carries the same
messages: the notebook side needs ``send`` and ``close``, rank 0's side ``receive``.
"""

from __future__ import annotations

import hmac
import json
import os
import socket
import threading

ACCEPTED = b"ok\n"


class ChannelError(ConnectionError):
    """The other side is gone, or is not who it should be."""


class SocketChannel:
    """The notebook's end: listens in ``folder``, accepts rank 0, then sends it messages."""

    def __init__(self, folder: str, secret: str):
        self.path = os.path.join(folder, "cells.sock")
        self._secret = secret
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        os.chmod(self.path, 0o600)
        listener.listen(4)
        listener.setblocking(False)
        self._listener: socket.socket | None = listener
        self._peer: socket.socket | None = None
        self._lock = threading.Lock()  # the session's pump closes the channel when the ranks end, while a start may accept

    @property
    def connected(self) -> bool:
        return self._peer is not None

    def try_accept(self) -> bool:
        """Accept rank 0 if it is knocking; a connection without the secret is dropped."""
        with self._lock:
            return self._try_accept()

    def _try_accept(self) -> bool:
        if self._peer is not None:
            return True
        if self._listener is None:
            return False
        try:
            peer, _ = self._listener.accept()
        except BlockingIOError:
            return False
        peer.setblocking(True)
        peer.settimeout(5.0)
        try:
            presented = _read_line(peer, 1024)
        except (OSError, ChannelError):
            peer.close()
            return False
        if not hmac.compare_digest(presented, self._secret.encode()):
            peer.close()
            return False
        try:
            peer.settimeout(None)
            peer.sendall(ACCEPTED)
        except OSError:  # it left meanwhile
            peer.close()
            return False
        self._peer = peer
        self._stop_listening()
        return True

    def send(self, message: dict) -> None:
        peer = self._peer  # (close() may clear it meanwhile)
        if peer is None:
            raise ChannelError("rank 0 has not connected")
        try:
            peer.sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            raise ChannelError(f"rank 0 is gone ({exc})") from None

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        with self._lock:
            self._stop_listening()
            if self._peer is not None:
                self._peer.close()
                self._peer = None


class SocketRankEnd:
    """Rank 0's end of a ``SocketChannel``."""

    def __init__(self, path: str, secret: str, timeout: float = 30.0):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(path)
        self._sock.sendall(secret.encode() + b"\n")
        if _read_line(self._sock, 16) != ACCEPTED.strip():
            raise ChannelError("the notebook refused this rank")
        self._buffer = b""

    def receive(self, timeout: float | None) -> dict | None:
        """The next message; None when ``timeout`` seconds pass without one. ``ChannelError``
        when the notebook has gone (its kernel stopped)."""
        self._sock.settimeout(timeout)
        while b"\n" not in self._buffer:
            try:
                chunk = self._sock.recv(1 << 16)
            except socket.timeout:
                return None
            if not chunk:
                raise ChannelError("the notebook closed the channel")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        self._sock.close()


def _read_line(sock: socket.socket, limit: int) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk or len(data) > limit:
            raise ChannelError("the connection ended before its first line")
        data += chunk
    return data.strip()
