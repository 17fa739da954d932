"""The session channel over TCP (Slurm): only a peer that proves the secret gets in, and a message
changed, replayed or made up on the way is refused by rank 0."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from mpi_magic.shared.channel import TCP, ChannelError, SocketChannel, SocketRankEnd


def _connected(channel: SocketChannel, secret: str) -> SocketRankEnd:
    """Rank 0's end, connected from a thread while the notebook's end accepts; what it raised, raised here."""
    found: dict = {}

    def connect() -> None:
        try:
            found["end"] = SocketRankEnd(channel.address, secret, timeout=5)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            found["error"] = exc

    thread = threading.Thread(target=connect)
    thread.start()
    deadline = time.monotonic() + 5
    while not channel.try_accept() and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)
    thread.join()
    if "error" in found:
        raise found["error"]
    return found["end"]


def _port(channel: SocketChannel) -> int:
    return int(channel.address.rpartition(":")[2])


def test_over_tcp_a_guess_is_dropped_then_rank_0_gets_signed_messages_and_nobody_else_connects():
    channel = SocketChannel(None, "s3cret", tcp_host="127.0.0.1")
    try:
        assert channel.address.startswith(f"{TCP}127.0.0.1:")
        intruder = socket.create_connection(("127.0.0.1", _port(channel)), timeout=5)
        intruder.sendall(b"s3cret\n")  # the secret itself is no answer to the challenge
        assert not channel.try_accept()
        reply = intruder.makefile("rb")
        assert len(reply.readline()) == 33 and reply.read() == b"", "a challenge, then dropped"
        reply.close()
        intruder.close()
        end = _connected(channel, "s3cret")
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", _port(channel)), timeout=1)  # it listens no more
        channel.send({"kind": "cell", "cell": 1})
        channel.send({"kind": "interrupt", "cell": 2})
        channel.send({"kind": "cell", "cell": 3})
        assert end.receive(5) == {"kind": "cell", "cell": 1}
        assert not end.interrupted(1) and not end.interrupted(3) and end.interrupted(2)  # cell 2's alone
        assert end.receive(5) == {"kind": "cell", "cell": 3}, "what the look read meanwhile is kept, in order"
        channel.send({"kind": "interrupt", "cell": 4})
        channel.send({"kind": "cell", "cell": 5})
        assert end.receive(5) == {"kind": "cell", "cell": 5}, "the main loop never gets an interrupt ..."
        assert end.interrupted(4), "... which waits for the look for it"
        end.close()
    finally:
        channel.close()


def test_a_wrong_secret_is_refused():
    channel = SocketChannel(None, "s3cret", tcp_host="127.0.0.1")
    try:
        with pytest.raises(ChannelError):
            _connected(channel, "guess")
        assert not channel.connected
    finally:
        channel.close()


@pytest.mark.parametrize("forge", ["changed", "replayed", "unsigned"])
def test_rank_0_refuses_a_message_not_signed_in_turn_by_the_notebook(forge):
    """A man in the middle holds the TCP stream: what he writes into it is refused."""
    channel = SocketChannel(None, "s3cret", tcp_host="127.0.0.1")
    try:
        end = _connected(channel, "s3cret")
        channel.send({"kind": "cell", "cell": 1, "dir": "/safe"})
        first = end._sock.recv(1 << 16, socket.MSG_PEEK)  # as it went on the wire
        assert end.receive(5)["dir"] == "/safe"
        signature, _, text = first.rstrip(b"\n").partition(b" ")
        forged = {"changed": signature + b" " + text.replace(b"/safe", b"/evil"),
                  "replayed": first.rstrip(b"\n"),
                  "unsigned": b'{"kind": "cell", "cell": 2, "dir": "/evil"}'}[forge]
        channel._peer.sendall(forged + b"\n")
        with pytest.raises(ChannelError, match="not signed with the session's secret"):
            end.receive(5)
        end.close()
    finally:
        channel.close()
