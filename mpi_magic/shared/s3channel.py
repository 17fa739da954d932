"""How the notebook hands cells to a SageMaker session's rank 0 through S3, and how rank 0 knows
they are the notebook's.

The notebook cannot connect to the instances, so every message is an S3 object under the
session's prefix: ``messages/<cell>.json`` (the cell to run, in order), ``interrupts/<cell>.json``
(stop that cell), ``payloads/<cell>.bin`` (the values it sends), ``results/<cell>/rank-N.bin``
(what comes back). Messages are signed with an Ed25519 key pair made when the session starts:
the job definition holds only the public half, which anyone allowed to DescribeTrainingJob may
read (an HMAC secret there would let them forge cells). Rank 0 checks the signature, the
session's name and the cell's number before acting on a message, and a payload is unpickled only
when its SHA-256 is the one the signed message names: whoever can write to the bucket can make
rank 0 refuse objects, never run code.

Small payloads ride in the signed message itself (``payload``), and where the notebook asks for it
(``end_record``) rank 0 writes the cell's end as one object, ``ends/<cell>-<nonce>.json``: every rank's
event lines from the cell, the tail of its output and its small results, signed with a key rank 0
made at start and announced in the job's log (which only the job writes), so that the notebook trusts
it as it trusts the log, and learns the cell's end without waiting for CloudWatch. The nonce is new
for each cell and comes in the signed message: only someone who can read the message (or list the
prefix once the record is there) knows where the record goes. An object there that is not rank 0's
record is refused, and the notebook keeps looking: rank 0's record, written later, takes its place.

The notebook also refreshes ``heartbeat``; rank 0 ends the session when it has not changed for
the heartbeat limit. It names when the notebook refreshing it took the session (started or
attached): a notebook that finds a later claim there has been taken over and lets go, so that two
notebooks never send cells to one session. It is not signed: forging it can only keep an idle
session up until ``--max-idle`` or ``--max-runtime`` ends it, or make a notebook let go.

Standard library when imported (the rank runtime imports it); boto3 and ``cryptography`` when
used. ``cryptography`` is in the ``sagemaker`` extra for the notebook; on the job only rank 0
checks signatures, so rank 0 installs it (``REQUIREMENT``) where the image lacks it
(``ensure_verifier``): the training images do not promise it, and installing it with pip on every
instance before the ranks start would slow every session's start for nothing.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import time

from .channel import ChannelError
from .layout import RESULTS, result_uri, split_s3

REQUIREMENT = "cryptography>=42"  # what rank 0 verifies signatures with, installed by the job where missing
MAX_MESSAGE = 64 * 1024  # a message names a payload (or holds a small one); anything larger is not read
INLINE_PAYLOAD = 40 * 1024  # bytes of payload a message may hold (base64 makes them a third larger)
MAX_END_RECORD = 16 * 1024 * 1024  # an end record larger than this is not read
FAST_POLL, SLOW_POLL = 0.1, 1.0  # seconds between rank 0's looks for the next cell: soon after one, and later
FAST_FOR = 60.0  # seconds after a cell during which rank 0 looks every FAST_POLL
INTERRUPT_POLL = 0.5  # seconds between rank 0's looks for an interrupt while a cell runs


class Refused(ValueError):
    """An object in the session's prefix that is not the notebook's message."""


def session_uri(job_prefix: str) -> str:
    return f"{job_prefix}/session"


def message_uri(uri: str, cell: int) -> str:
    return f"{uri}/messages/{cell:08d}.json"


def interrupt_uri(uri: str, cell: int) -> str:
    return f"{uri}/interrupts/{cell:08d}.json"


def payload_uri(uri: str, cell: int) -> str:
    return f"{uri}/payloads/{cell:08d}.bin"


def end_uri(uri: str, cell: int, nonce: str) -> str:
    """Where rank 0 puts the end record of ``cell``; ``nonce``: the one the cell's signed message names."""
    return f"{uri}/ends/{cell:08d}-{nonce}.json"


def results_uri(uri: str, cell: int) -> str:
    """Where the ranks put the results of ``cell`` (``layout.result_uri`` names each rank's key)."""
    return f"{uri}/results/{cell:08d}"


def heartbeat_uri(uri: str) -> str:
    return f"{uri}/heartbeat"


def cell_of(key: str) -> int | None:
    """The cell number of a ``messages/`` key, None for any other key."""
    name = key.rsplit("/", 1)[-1]
    stem = name[:-len(".json")] if name.endswith(".json") else ""
    return int(stem) if stem.isdigit() else None


# -- signing (the notebook) and checking (rank 0) -----------------------------------------------

class Signer:
    """The notebook's key pair for one session; ``public_text`` goes into the job definition."""

    def __init__(self, private_bytes: bytes | None = None):
        try:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        except ImportError:
            from ..errors import BackendNotAvailable

            raise BackendNotAvailable("a session whose cells travel through S3 signs them with the cryptography "
                                      "package, which is not installed: pip install 'cryptography>=42'") from None

        self._key = (Ed25519PrivateKey.from_private_bytes(private_bytes) if private_bytes
                     else Ed25519PrivateKey.generate())

    @property
    def private_bytes(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                       serialization.NoEncryption())

    @property
    def public_text(self) -> str:
        from cryptography.hazmat.primitives import serialization

        raw = self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.b64encode(raw).decode()

    def sign(self, body: dict) -> bytes:
        """The object to store: the body as JSON text, and the signature of exactly that text."""
        text = json.dumps(body, sort_keys=True)
        signature = self._key.sign(text.encode())
        return json.dumps({"body": text, "signature": base64.b64encode(signature).decode()}).encode()


def ensure_verifier() -> None:
    """Rank 0 of a session job: ``cryptography`` importable, installed with pip if the image lacks it."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        import subprocess
        import sys

        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", REQUIREMENT], check=True)


def open_signed(data: bytes, public_text: str, whose: str = "the notebook's") -> dict:
    """The body of a message signed by the key whose public half is ``public_text`` (``whose`` key,
    as refusals name it); ``Refused`` for anything else. Nothing in ``data`` is acted on before the
    signature checks out."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        envelope = json.loads(data)
        text, signature = envelope["body"], base64.b64decode(envelope["signature"], validate=True)
        if not isinstance(text, str):
            raise TypeError("the body is not text")
    except (ValueError, KeyError, TypeError) as exc:
        raise Refused(f"not a signed message ({type(exc).__name__})") from None
    try:
        Ed25519PublicKey.from_public_bytes(base64.b64decode(public_text)).verify(signature, text.encode())
    except InvalidSignature:
        raise Refused(f"not signed by {whose} key") from None
    body = json.loads(text)
    if not isinstance(body, dict):
        raise Refused("a signed message that is not an object")
    return body


# -- the notebook's end ---------------------------------------------------------------------------

class TakenOver(ChannelError):
    """Another notebook took the session over (``%mpirun_session attach``) after this one took it."""


class NotebookEnd:
    """Writes the notebook's messages, payloads and heartbeat with ``s3`` (the job's client, so
    that every call is counted with the job's)."""

    def __init__(self, s3, uri: str, job_name: str, signer: Signer):
        self.s3, self.uri, self.job_name, self.signer = s3, uri, job_name, signer
        self.claimed_at = time.time()  # when this notebook took the session (the same clock: one machine)
        self._refused_end: tuple[str, str] | None = None  # (uri, ETag) of the last object refused as an end record

    def _put(self, uri: str, body: bytes) -> None:
        bucket, key = split_s3(uri)
        self.s3.put_object(Bucket=bucket, Key=key, Body=body)

    def send_cell(self, cell: int, payload_path: str, end_record: bool = False) -> str | None:
        """The payload first, then the message naming its digest: rank 0 never sees one without the
        other. A small payload goes in the message; ``end_record``: rank 0 writes the cell's end record,
        at the uri returned."""
        from .payload import file_digest

        body: dict = {"kind": "cell", "cell": cell, "job": self.job_name, "sha256": file_digest(payload_path),
                      "end_record": end_record}
        if end_record:
            body["end_nonce"] = secrets.token_urlsafe(16)
        if end_record and os.path.getsize(payload_path) <= INLINE_PAYLOAD:
            with open(payload_path, "rb") as f:
                body["payload"] = base64.b64encode(f.read()).decode()
        else:
            bucket, key = split_s3(payload_uri(self.uri, cell))
            self.s3.upload_file(payload_path, bucket, key)
        self._put(message_uri(self.uri, cell), self.signer.sign(body))
        return end_uri(self.uri, cell, body["end_nonce"]) if end_record else None

    def end_record(self, uri: str, cell: int, rank_key: str) -> dict | None:
        """The end record of ``cell`` at ``uri``, checked against rank 0's key; None while there is none,
        or while the object there is one refused already (not read again: S3 answers 304 Not Modified).
        ``Refused`` once for each object there that is not rank 0's record of the cell."""
        from botocore.exceptions import ClientError

        bucket, key = split_s3(uri)
        refused = self._refused_end[1] if self._refused_end and self._refused_end[0] == uri else None
        try:
            reply = self.s3.get_object(Bucket=bucket, Key=key, **({"IfNoneMatch": refused} if refused else {}))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "304"):
                return None
            raise
        with reply["Body"] as stream:
            data = stream.read(MAX_END_RECORD + 1)
        try:
            if len(data) > MAX_END_RECORD:
                raise Refused(f"larger than {MAX_END_RECORD} bytes")
            body = open_signed(data, rank_key, "rank 0's")
            if (body.get("cell"), body.get("job")) != (cell, self.job_name) or not isinstance(body.get("ranks"), list):
                raise Refused(f"signed by rank 0, but not the end record of cell {cell} of {self.job_name}")
        except Refused:
            self._refused_end = (uri, reply.get("ETag", ""))
            raise
        return body

    def interrupt(self, cell: int) -> None:
        body = {"kind": "interrupt", "cell": cell, "job": self.job_name}
        self._put(interrupt_uri(self.uri, cell), self.signer.sign(body))

    def beat(self) -> None:
        """Refresh the heartbeat; ``TakenOver`` instead when a later notebook holds the session."""
        self.check_held()
        self._put(heartbeat_uri(self.uri), json.dumps({"claimed_at": self.claimed_at, "at": time.time()}).encode())

    def check_held(self) -> None:
        """``TakenOver`` when the heartbeat names a claim later than this notebook's."""
        from botocore.exceptions import ClientError

        bucket, key = split_s3(heartbeat_uri(self.uri))
        try:
            data = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read(MAX_MESSAGE)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return  # no heartbeat yet: the session is starting
            raise
        try:
            claimed = float(json.loads(data)["claimed_at"])
        except (ValueError, KeyError, TypeError):
            return  # not a claim
        if claimed > self.claimed_at:
            raise TakenOver(f"another notebook took session {self.job_name} over (%mpirun_session attach) "
                            "after this one")

    def last_cell(self) -> int:
        """The number of the last cell this key sent (0: none)."""
        return last_cell(self.s3, self.uri, self.signer.public_text, self.job_name)


def last_cell(s3, uri: str, public_text: str, job_name: str) -> int:
    """The number of the last cell the notebook sent (0: none), from the messages in S3; an object
    not signed by the key whose public half is ``public_text`` (someone else's) does not count."""
    bucket, prefix = split_s3(f"{uri}/messages/")
    numbers = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        numbers += [n for n in (cell_of(item["Key"]) for item in page.get("Contents", [])) if n is not None]
    for number in sorted(numbers, reverse=True):
        data = s3.get_object(Bucket=bucket, Key=f"{prefix}{number:08d}.json")["Body"].read(MAX_MESSAGE)
        try:
            body = open_signed(data, public_text)
        except Refused:
            continue
        if body.get("cell") == number and body.get("job") == job_name:
            return number
    return 0


# -- rank 0's end -----------------------------------------------------------------------------------

class S3RankEnd:
    """Rank 0's end: waits for the next cell's message, checks the heartbeat, looks for interrupts.

    ``receive`` has the contract of ``channel.SocketRankEnd.receive``: the next message, None after
    ``timeout`` seconds without one, ``ChannelError`` once the notebook is gone (its heartbeat
    stopped). A refused object is said on stderr (it reaches the job's log) once per version.
    """

    def __init__(self, uri: str, public_text: str, heartbeat_limit: float | None, job_name: str,
                 say=None, clock=time.monotonic):
        self.uri, self.public_text, self.job_name = uri, public_text, job_name
        self.heartbeat_limit = heartbeat_limit
        self._s3 = None
        self.bucket, _ = split_s3(uri)
        self.next_cell = 1
        self.clock = clock
        self._say = say or (lambda text: None)
        self._last_message_at = clock()
        self._refused: dict[str, str] = {}  # key -> ETag already refused
        self._beat: tuple[str, float] | None = None  # (ETag, when this rank first saw it)
        self._beat_checked = 0.0
        self._complained_at = -60.0

    @property
    def s3(self):
        """boto3's S3 client, made on first use: most ranks of an instance never need one, and
        importing boto3 costs each rank a fraction of a second and tens of MB."""
        if self._s3 is None:
            import boto3

            self._s3 = boto3.client("s3")
        return self._s3

    def _get(self, uri: str) -> tuple[bytes, str] | None:
        """(the object's first bytes, its ETag), None when there is none."""
        from botocore.exceptions import ClientError

        bucket, key = split_s3(uri)
        try:
            reply = self.s3.get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        with reply["Body"] as body:
            return body.read(MAX_MESSAGE + 1), reply.get("ETag", "")

    def _checked(self, uri: str, kind: str, cell: int) -> dict | None:
        """The notebook's message at ``uri``, or None (absent, or refused and said so)."""
        found = self._get(uri)
        if found is None:
            return None
        data, etag = found
        if self._refused.get(uri) == etag:
            return None
        try:
            if len(data) > MAX_MESSAGE:
                raise Refused(f"larger than {MAX_MESSAGE} bytes")
            body = open_signed(data, self.public_text)
            if (body.get("kind"), body.get("cell"), body.get("job")) != (kind, cell, self.job_name):
                raise Refused(f"signed, but not {kind} {cell} of {self.job_name}")
        except Refused as exc:
            self._refused[uri] = etag
            self._say(f"mpi_magic session: refused {uri}: {exc}; it was not run")
            return None
        return body

    def receive(self, timeout: float | None) -> dict | None:
        deadline = None if timeout is None else self.clock() + timeout
        while True:
            try:
                message = self._checked(message_uri(self.uri, self.next_cell), "cell", self.next_cell)
            except Exception as exc:  # noqa: BLE001 - S3 refused or unreachable for a while: look again
                self._complain(f"could not read the next cell ({type(exc).__name__}: {exc}); trying again")
                message = None
            if message is not None:
                self.next_cell += 1
                self._last_message_at = self.clock()
                return message
            self._check_heartbeat()
            now = self.clock()
            if deadline is not None and now >= deadline:
                return None
            nap = FAST_POLL if now - self._last_message_at < FAST_FOR else SLOW_POLL
            time.sleep(nap if deadline is None else max(0.0, min(nap, deadline - now)))
            if deadline is not None and self.clock() >= deadline:
                return None

    def skip_cells_sent(self) -> None:
        """Wait for the cell after the last one already in S3. Called before the ranks say they are
        up: the notebook sends its first cell only then, so a cell already here was sent to ranks
        that ended (SageMaker started the job again after a spot interruption, and the notebook ends
        the session); it ran, or failed, on the ranks gone, and never runs again."""
        self.next_cell = last_cell(self.s3, self.uri, self.public_text, self.job_name) + 1

    def _complain(self, text: str) -> None:
        """Say a trouble once a minute at most: the job's log should not fill with one failure."""
        now = self.clock()
        if now - self._complained_at > 60:
            self._complained_at = now
            self._say("mpi_magic session: " + text)

    def cell_ended(self) -> None:
        """The idle time (and the fast polling after a cell) counts from the end of a cell."""
        self._last_message_at = self.clock()

    def _check_heartbeat(self) -> None:
        limit = self.heartbeat_limit
        now = self.clock()
        if not limit or now - self._beat_checked < min(5.0, limit / 4):
            return
        self._beat_checked = now
        bucket, key = split_s3(heartbeat_uri(self.uri))
        try:
            etag = self.s3.head_object(Bucket=bucket, Key=key).get("ETag", "")
        except Exception as exc:  # noqa: BLE001 - gone or unreadable: it is not being refreshed
            self._complain(f"could not read the heartbeat ({type(exc).__name__}: {exc})")
            etag = ""
        if self._beat is None or self._beat[0] != etag:
            self._beat = (etag, now)
        elif now - self._beat[1] > limit:
            raise ChannelError(f"the notebook's heartbeat stopped: not refreshed for {limit:g}s")

    def interrupted(self, cell: int) -> bool:
        """True when the notebook asked to interrupt ``cell``."""
        return self._checked(interrupt_uri(self.uri, cell), "interrupt", cell) is not None

    def fetch_payload(self, cell: int, sha256: str, folder: str) -> str:
        """The payload of ``cell`` in ``folder``, checked against the signed digest before anyone reads it."""
        from ..errors import PayloadError
        from .payload import PAYLOAD_FILE, file_digest

        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, PAYLOAD_FILE)
        bucket, key = split_s3(payload_uri(self.uri, cell))
        self.s3.download_file(bucket, key, path)
        found = file_digest(path)
        if found != sha256:
            os.remove(path)
            raise PayloadError(f"s3://{bucket}/{key} is not the payload the notebook signed (expected "
                               f"{sha256[:12]}..., found {found[:12]}...); it was changed in S3, so it is not loaded")
        return path

    def put_end(self, message: dict, data: bytes) -> None:
        """The end record of the cell of ``message``, where that signed message says."""
        bucket, key = split_s3(end_uri(self.uri, message["cell"], message["end_nonce"]))
        self.s3.put_object(Bucket=bucket, Key=key, Body=data)

    def upload_result(self, path: str, cell: int, rank: int, kind: str = RESULTS) -> None:
        bucket, key = split_s3(result_uri(results_uri(self.uri, cell), rank, kind))
        self.s3.upload_file(path, bucket, key)
