"""How the notebook hands cells to a session's rank 0: one signed JSON message per line.

A message is small (what to run and where its payload lies); values travel in payload files.
The notebook listens and accepts exactly one connection, rank 0's, then stops listening, so
nothing else can connect. Rank 0 proves it holds the session's secret without sending it (an
HMAC of a fresh challenge), and every message carries an HMAC of its text and its number, so a
connection taken over on the way, or a message replayed, is refused. Locally the listener is a
Unix socket in a private folder (0700); on a cluster (Slurm) it is a TCP port that rank 0 reaches
over the cluster's network (``tcp:HOST:PORT``). Another transport (a cloud store) carries the
same messages: the notebook side needs ``send`` and ``close``, rank 0's side ``receive``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import threading

ACCEPTED = b"ok\n"
TCP = "tcp:"  # an address that starts so is HOST:PORT, else a Unix socket's path
HANDSHAKE_LIMIT = 5.0  # seconds a connecting peer gets to answer the challenge


def cell_message(number: int, job_dir: str, digest: str | None) -> dict:
    """What tells rank 0 to run cell ``number``, whose payload is in ``job_dir`` (``digest``: its SHA-256)."""
    return {"kind": "cell", "cell": number, "dir": job_dir, "digest": digest}


def interrupt_message(number: int) -> dict:
    """What tells rank 0 to interrupt cell ``number`` on every rank."""
    return {"kind": "interrupt", "cell": number}


def stop_message(reason: str) -> dict:
    """What tells the ranks the session ends, and why."""
    return {"kind": "stop", "reason": reason}


class ChannelError(ConnectionError):
    """The other side is gone, or is not who it should be."""


def _proof(secret: str, challenge: bytes) -> bytes:
    return hmac.new(secret.encode(), b"rank 0:" + challenge, hashlib.sha256).hexdigest().encode()


def _signature(secret: str, number: int, text: bytes) -> bytes:
    return hmac.new(secret.encode(), f"{number}:".encode() + text, hashlib.sha256).hexdigest().encode()


class SocketChannel:
    """The notebook's end: listens (a Unix socket in ``folder``, or TCP on every interface where
    ``tcp_host`` names this machine as the ranks reach it), accepts rank 0, then sends it messages."""

    def __init__(self, folder: str | None, secret: str, tcp_host: str | None = None):
        self._secret = secret
        self.path: str | None = None
        if tcp_host is None:
            assert folder is not None, "a Unix socket lives in a folder"
            self.path = os.path.join(folder, "cells.sock")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(self.path)
            os.chmod(self.path, 0o600)
            self.address = self.path
        else:
            listener = socket.create_server(("", 0), family=socket.AF_INET)
            self.address = f"{TCP}{tcp_host}:{listener.getsockname()[1]}"
        listener.listen(4)
        listener.setblocking(False)
        self._listener: socket.socket | None = listener
        self._peer: socket.socket | None = None
        self._sent = 0  # messages signed so far: each one's number is in its signature
        self._lock = threading.Lock()  # the session's pump closes the channel when the ranks end, while a start may accept

    @property
    def connected(self) -> bool:
        return self._peer is not None

    def try_accept(self) -> bool:
        """Accept rank 0 if it is knocking; a connection that cannot prove the secret is dropped."""
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
        peer.settimeout(HANDSHAKE_LIMIT)
        challenge = secrets.token_hex(16).encode()
        try:
            peer.sendall(challenge + b"\n")
            presented = _read_line(peer, 1024)
        except (OSError, ChannelError):
            peer.close()
            return False
        if not hmac.compare_digest(presented, _proof(self._secret, challenge)):
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
        text = json.dumps(message).encode()
        self._sent += 1
        try:
            peer.sendall(_signature(self._secret, self._sent, text) + b" " + text + b"\n")
        except OSError as exc:
            raise ChannelError(f"rank 0 is gone ({exc})") from None

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            if self.path is not None:
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
    """Rank 0's end of a ``SocketChannel`` (``address``: a Unix socket's path, or ``tcp:HOST:PORT``)."""

    def __init__(self, address: str, secret: str, timeout: float = 30.0):
        if address.startswith(TCP):
            host, _, port = address[len(TCP):].rpartition(":")
            self._sock = socket.create_connection((host, int(port)), timeout=timeout)
        else:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.settimeout(timeout)
            self._sock.connect(address)
        self._secret = secret
        challenge = _read_line(self._sock, 64)
        self._sock.sendall(_proof(secret, challenge) + b"\n")
        if _read_line(self._sock, 16) != ACCEPTED.strip():
            raise ChannelError("the notebook refused this rank")
        self._buffer = b""
        self._received = 0
        self._held: list[dict] = []  # read while looking for an interrupt: handed out by receive()
        self._interrupts: set[int] = set()  # the cells the notebook asked to interrupt
        # rank 0's main loop receives while its interrupt watcher may still look (the other ranks not yet
        # back from the cell): one reads at a time
        self._lock = threading.Lock()

    def receive(self, timeout: float | None) -> dict | None:
        """The next message other than an interrupt (those are kept for ``interrupted``); None when
        ``timeout`` seconds pass without one. ``ChannelError`` when the notebook has gone (its kernel
        stopped), or a message is not the notebook's."""
        with self._lock:
            while True:
                message = self._held.pop(0) if self._held else self._read(timeout)
                if message is None or message.get("kind") != "interrupt":
                    return message
                self._interrupts.add(message.get("cell", 0))

    def interrupted(self, cell: int) -> bool:
        """Whether the notebook asked to interrupt ``cell`` (looked for without waiting); any other
        message read meanwhile is kept for ``receive``."""
        with self._lock:
            message = self._read(0.0)
            while message is not None:
                if message.get("kind") == "interrupt":
                    self._interrupts.add(message.get("cell", 0))
                else:
                    self._held.append(message)
                message = self._read(0.0)
            return cell in self._interrupts

    def _read(self, timeout: float | None) -> dict | None:
        """The next message on the wire, its signature checked (under the lock)."""
        self._sock.settimeout(timeout)
        while b"\n" not in self._buffer:
            try:
                chunk = self._sock.recv(1 << 16)
            except (socket.timeout, BlockingIOError):
                return None
            if not chunk:
                raise ChannelError("the notebook closed the channel")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        signature, _, text = line.partition(b" ")
        self._received += 1
        if not hmac.compare_digest(signature, _signature(self._secret, self._received, text)):
            raise ChannelError("a message on the channel was not signed with the session's secret")
        return json.loads(text)

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
