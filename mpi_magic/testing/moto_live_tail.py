"""moto's server, with CloudWatch Logs' Live Tail streamed as AWS streams it.

moto answers StartLiveTail with one snapshot of the events already stored, then ends the
response. AWS instead holds the response open as an event stream: a ``sessionStart``, then every
second a ``sessionUpdate`` with the events ingested in that second (none stored before the stream
began), at most 500 of them (sampled above that, and then ``sampled`` is true), until the client
closes it or three hours pass (``SessionTimeoutException``). This server does the same in front of
moto's own application, reading moto's stored events in this process. It applies no filter
pattern (mpi_magic sends none).

``--pace aws`` makes every S3 request wait as long as S3 takes to answer (``aws_pace``).

Test hook: ``refuse_live_tail(endpoint, "AccessDeniedException")`` makes StartLiveTail fail with
that error (as for a role without ``logs:StartLiveTail``) until called again with None.

    python -m mpi_magic.testing.moto_live_tail --port 5000
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import time
import uuid
import zlib

from .aws_pace import NONE, AwsPace, add_arguments, pace as named_pace

LIVE_TAIL_TARGET = "Logs_20140328.StartLiveTail"
REFUSAL_PATH = "/_mpi_magic/live_tail_refusal"
UPDATE_EVERY = 1.0  # seconds between stream updates, as AWS sends them
MOST_PER_UPDATE = 500  # events in one update; above that AWS samples them down
STREAM_LIMIT = 3 * 3600.0  # seconds a stream stays open


def event_message(name: str, body: dict, kind: str = "event") -> bytes:
    """One message of the AWS event stream encoding (``application/vnd.amazon.eventstream``)."""
    type_header = ":event-type" if kind == "event" else ":exception-type"
    headers = b"".join(_string_header(key, value) for key, value in (
        (":message-type", kind), (type_header, name), (":content-type", "application/json")))
    payload = json.dumps(body).encode()
    prelude = struct.pack(">II", 16 + len(headers) + len(payload), len(headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + payload
    return message + struct.pack(">I", zlib.crc32(message))


def _string_header(name: str, value: str) -> bytes:
    encoded_name, encoded_value = name.encode(), value.encode()
    return struct.pack(">B", len(encoded_name)) + encoded_name + struct.pack(">BH", 7, len(encoded_value)) + encoded_value


def _region_of(environ: dict) -> str:
    """The region the request was signed for (``Credential=KEY/DATE/REGION/logs/aws4_request``)."""
    found = re.search(r"Credential=[^/]+/[^/]+/([^/]+)/", environ.get("HTTP_AUTHORIZATION", ""))
    return found.group(1) if found else "us-east-1"


def _service_of(environ: dict) -> str:
    """The service the request was signed for (``Credential=KEY/DATE/REGION/SERVICE/aws4_request``)."""
    found = re.search(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/", environ.get("HTTP_AUTHORIZATION", ""))
    return found.group(1) if found else ""


def _error(start_response, status: str, kind: str, message: str) -> list[bytes]:
    start_response(status, [("Content-Type", "application/x-amz-json-1.1"), ("x-amzn-ErrorType", kind)])
    return [json.dumps({"__type": kind, "message": message}).encode()]


class LiveTailFront:
    """WSGI middleware: StartLiveTail streamed here, every other request passed to moto (an S3
    request after ``pace.s3_request`` seconds)."""

    def __init__(self, app, pace: AwsPace = NONE):
        self.app, self.pace = app, pace
        self.refusal: str | None = None  # the error StartLiveTail answers with, if any (test hook)
        self.refused = 0

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") == REFUSAL_PATH:
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            self.refusal = json.loads(body or b"{}").get("refuse")
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps({"refused": self.refused}).encode()]
        if environ.get("HTTP_X_AMZ_TARGET") != LIVE_TAIL_TARGET:
            if self.pace.s3_request and _service_of(environ) == "s3":
                time.sleep(self.pace.s3_request)
            return self.app(environ, start_response)
        if self.refusal:
            self.refused += 1
            return _error(start_response, "400 Bad Request", self.refusal, "not allowed to start a Live Tail session")
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.logs.models import logs_backends

        length = int(environ.get("CONTENT_LENGTH") or 0)
        request = json.loads(environ["wsgi.input"].read(length) or b"{}")
        identifiers = request.get("logGroupIdentifiers") or []
        names, prefixes = request.get("logStreamNames"), request.get("logStreamNamePrefixes")
        if not 1 <= len(identifiers) <= 10 or (names and prefixes) or ((names or prefixes) and len(identifiers) != 1):
            return _error(start_response, "400 Bad Request", "InvalidParameterException",
                          "logGroupIdentifiers: 1 to 10 log group ARNs; logStreamNames or logStreamNamePrefixes "
                          "only with one log group")
        backend = logs_backends[DEFAULT_ACCOUNT_ID][_region_of(environ)]
        groups = []
        for identifier in identifiers:
            group = next((g for g in list(backend.groups.values()) if g.arn == identifier), None)
            if group is None:
                return _error(start_response, "400 Bad Request", "ResourceNotFoundException",
                              f"The specified log group does not exist: {identifier}")
            groups.append(group)
        start_response("200 OK", [("Content-Type", "application/vnd.amazon.eventstream")])
        started = {"requestId": str(uuid.uuid4()), "sessionId": str(uuid.uuid4()), "logGroupIdentifiers": identifiers,
                   "logStreamNames": names or [], "logStreamNamePrefixes": prefixes or [],
                   "logEventFilterPattern": request.get("logEventFilterPattern", "")}
        return self._stream(groups, set(names or ()), tuple(prefixes or ()), started)

    def _stream(self, groups, names: set[str], prefixes: tuple[str, ...], started: dict):
        """The response body: the session's start, then an update every second."""
        yield event_message("initial-response", {})  # the JSON protocol's (empty) non-stream part of the reply
        yield event_message("sessionStart", started)

        def matching():
            for group in groups:
                for stream in list(group.streams.values()):
                    name = stream.log_stream_name
                    if (not names and not prefixes) or name in names or (prefixes and name.startswith(prefixes)):
                        yield group, stream

        read_to = {(group.arn, stream.log_stream_name): len(stream.events) for group, stream in matching()}
        opened = time.monotonic()
        while time.monotonic() - opened < STREAM_LIMIT:
            time.sleep(UPDATE_EVERY)
            results = []
            for group, stream in matching():
                key = (group.arn, stream.log_stream_name)
                events = stream.events[read_to.get(key, 0):]
                read_to[key] = read_to.get(key, 0) + len(events)
                results += [{"logStreamName": stream.log_stream_name, "logGroupIdentifier": group.arn,
                             "message": e.message, "timestamp": e.timestamp, "ingestionTime": e.ingestion_time}
                            for e in events]
            sampled = len(results) > MOST_PER_UPDATE
            if sampled:  # an even sample, in order
                results = [results[i * len(results) // MOST_PER_UPDATE] for i in range(MOST_PER_UPDATE)]
            yield event_message("sessionUpdate", {"sessionMetadata": {"sampled": sampled}, "sessionResults": results})
        yield event_message("SessionTimeoutException", {"message": "Session timed out after three hours"}, "exception")


def refuse_live_tail(endpoint: str, error: str | None) -> int:
    """Make StartLiveTail on ``endpoint`` fail with ``error`` from now on (None: serve it again);
    returns how many it refused so far."""
    import urllib.request

    request = urllib.request.Request(endpoint.rstrip("/") + REFUSAL_PATH, data=json.dumps({"refuse": error}).encode(),
                                     method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())["refused"]


def main() -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import WSGIRequestHandler, run_simple

    handler: type[WSGIRequestHandler] = WSGIRequestHandler
    try:
        from moto.moto_server.threaded_moto_server import MotoRequestHandler

        handler = MotoRequestHandler
    except ImportError:  # a moto before its own request handler
        pass

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    add_arguments(parser)
    args = parser.parse_args()
    front = LiveTailFront(DomainDispatcherApplication(create_backend_app), named_pace(args.pace, args.instance_start))
    run_simple(args.host, args.port, front, threaded=True, request_handler=handler)


if __name__ == "__main__":
    main()
