"""Named values <-> one self-describing, versioned file (payloads in, results out).

Layout: ``MAGIC``, an 8-byte header length, a JSON header (format, Python and cloudpickle
versions, free-form ``meta``, one entry per name with its sizes), then each name's pickle
followed by its out-of-band buffers (pickle protocol 5). Buffers are written straight from
the objects that own them, so a 1 GiB array is never copied into one big bytes object.

Large buffers start on a page boundary and are read back as private (copy-on-write) memory
maps: ranks on one machine share the file's pages until they write, and nothing is read
that the cell does not touch. When the file travels beyond the user's private folder, its
SHA-256 is pinned at submission and checked on read before anything is unpickled.
"""

from __future__ import annotations

import io
import os
import struct
import sys

from . import wire
TYPE_CHECKING = False  # typing is not imported on the ranks: it costs each one milliseconds at start-up
if TYPE_CHECKING:
    import pickle  # where values are pickled or unpickled: a rank whose cell sends and returns none needs it not
    from typing import Any, Callable

    import cloudpickle


MAGIC = b"MPIMAGIC"
FORMAT_VERSION = 3
PAYLOAD_FILE = "payload.bin"
_LENGTH = struct.Struct("<Q")
MAP_THRESHOLD = 1 << 20  # buffers this big are aligned in the file and memory-mapped
ALIGN = 1 << 16  # a multiple of every common page size (4, 16 and 64 KiB), so any reader can map


class Packed:
    """One value pickled, its big buffers kept out of band (not copied).

    A plain class, as are the others the ranks use: dataclasses would cost every rank
    milliseconds at start-up."""

    __slots__ = ("name", "data", "buffers")

    def __init__(self, name: str, data: bytes, buffers: list[memoryview]):
        self.name, self.data, self.buffers = name, data, buffers

    @property
    def size(self) -> int:
        return len(self.data) + sum(b.nbytes for b in self.buffers)


def pack(name: str, value: Any, pickler: Callable[..., pickle.Pickler] | None = None) -> Packed:
    """Pickle ``value`` with cloudpickle (or the given pickler); raises what pickling raises.

    cloudpickle is imported here, not with the module: most ranks only read a payload, and
    unpickling imports what the pickle needs by itself.
    """
    if pickler is None:
        import cloudpickle

        pickler = cloudpickle.Pickler
    buffers: list[pickle.PickleBuffer] = []
    with io.BytesIO() as out:
        pickler(out, protocol=5, buffer_callback=buffers.append).dump(value)
        data = out.getvalue()
    return Packed(name, data, [b.raw() for b in buffers])


def pack_result(name: str, value: Any) -> Packed:
    """Pickle a value going back to the notebook: with plain pickle when it can, cloudpickle when it must.

    What plain pickle writes loads the same as cloudpickle's and costs the rank no import.
    What only cloudpickle carries (functions and classes the cell defined, lambdas) makes
    plain pickle raise, since it refuses a reference that does not lead back to the object;
    their code keeps the name and lines of the notebook's cell it came from (``notebook_cells``).
    """
    import pickle

    try:
        return pack(name, value, pickle.Pickler)
    except Exception:  # noqa: BLE001 - whatever plain pickle cannot do, cloudpickle may
        from .notebook_cells import pickler

        return pack(name, value, pickler())


def size_text(n: float) -> str:
    """Bytes as a person reads them: 512 B, 3.1 MiB, 1.3 GiB."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            break
    return f"{n:.1f} {unit}"


def python_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))


def write(path: str, packed: list[Packed], meta: dict[str, Any], digest: bool = True) -> str | None:
    """Write ``packed`` values and ``meta`` to ``path`` (mode 0600); returns the SHA-256 if asked."""
    header = {
        "format": FORMAT_VERSION,
        "python": python_version(),
        # the cloudpickle that may have written pickles here; informative, never imported for it
        "cloudpickle": getattr(sys.modules.get("cloudpickle"), "__version__", ""),
        "meta": meta,
        "align": ALIGN,
        "entries": [{"name": p.name, "pickle": len(p.data), "buffers": [b.nbytes for b in p.buffers]} for p in packed],
    }
    head = encode_header(header)
    hasher = _sha256() if digest else None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # whatever the umask, and a file written before keeps its mode otherwise
    with os.fdopen(fd, "wb", buffering=0) as out:
        position = 0
        for chunk, is_buffer in _chunks(head, packed):
            if is_buffer and chunk.nbytes >= MAP_THRESHOLD and position % ALIGN:
                position += _write_all(out, memoryview(bytes(-position % ALIGN)), hasher)
            position += _write_all(out, chunk, hasher)
    return hasher.hexdigest() if hasher else None


def _write_all(out, view: memoryview, hasher) -> int:
    if hasher is not None:
        hasher.update(view)
    size = view.nbytes
    while view.nbytes:  # unbuffered writes may be partial
        view = view[out.write(view):]
    return size


def _chunks(head: bytes, packed: list[Packed]):
    """(bytes to write, whether it is an out-of-band buffer), in file order."""
    yield memoryview(head), False
    for p in packed:
        yield memoryview(p.data), False
        for buffer in p.buffers:
            yield buffer, True


def encode_header(header: dict[str, Any]) -> bytes:
    """What a file starts with: ``MAGIC``, the JSON header's length, the JSON header."""
    head = wire.dumps(header).encode()
    return MAGIC + _LENGTH.pack(len(head)) + head


def read_header(read: Callable[[int], bytes | bytearray], name: str = "the payload") -> tuple[dict[str, Any], int]:
    """The header of a file read through ``read(size)`` (a file's, or ranged reads of an S3
    object), and the offset its first entry starts at. Nothing is checked but the framing."""
    magic = read(len(MAGIC))
    if magic != MAGIC:
        raise _refused(f"{name} is not an mpi_magic payload")
    length = read(_LENGTH.size)
    head = read(_LENGTH.unpack(length)[0]) if len(length) == _LENGTH.size else b""
    try:
        header = wire.loads(head.decode())
    except ValueError:
        raise _refused(f"{name} is truncated or damaged: its header does not read") from None
    return header, len(MAGIC) + _LENGTH.size + len(head)


class Bundle:
    """A read file: its header and, per name, the bytes to unpickle."""

    __slots__ = ("header", "raw")

    def __init__(self, header: dict[str, Any], raw: dict[str, tuple[bytearray, list[bytearray | memoryview]]]):
        self.header, self.raw = header, raw

    @property
    def meta(self) -> dict[str, Any]:
        return self.header["meta"]

    def load(self, name: str) -> Any:
        import pickle

        data, buffers = self.raw[name]
        return pickle.loads(data, buffers=buffers)

    def load_all(self) -> tuple[dict[str, Any], dict[str, str]]:
        """Every value that unpickles, and {name: reason} for those that do not."""
        values, problems = {}, {}
        for name in self.raw:
            try:
                values[name] = self.load(name)
            except Exception as exc:  # noqa: BLE001 - reported per name
                problems[name] = f"{type(exc).__name__}: {exc}"
        return values, problems


def read(path: str, expected_digest: str | None = None) -> Bundle:
    """Read and check a file written by ``write``; nothing is unpickled yet.

    Refuses (``PayloadError``) a damaged file, a digest that does not match, or a file
    written by another Python minor version, whose pickles would fail obscurely.
    """
    if expected_digest:  # before anything in the file is parsed, let alone unpickled
        found = file_digest(path)
        if found != expected_digest:
            raise _refused(
                f"{path} does not match the digest it was submitted with "
                f"(expected {expected_digest[:12]}..., found {found[:12]}...); "
                "it was modified after submission, so it is not loaded"
            )
    with open(path, "rb", buffering=0) as src:
        header, _ = read_header(lambda size: _read_exact(src, size), path)
        _check_compatible(header)
        claimed = sum(e["pickle"] + sum(e["buffers"]) for e in header["entries"])
        if claimed > os.fstat(src.fileno()).st_size:
            raise _refused(f"payload is truncated: its header describes {claimed} bytes, more than the file holds")
        raw = {}
        for entry in header["entries"]:
            data = _read_exact(src, entry["pickle"])
            raw[entry["name"]] = (data, [_read_buffer(src, n, header["align"]) for n in entry["buffers"]])
        if src.read(1):
            raise _refused(f"{path} has trailing bytes; it was modified after it was written")
    return Bundle(header, raw)


def _read_buffer(src: io.RawIOBase, size: int, align: int) -> bytearray | memoryview:
    """A small buffer is read; a large one is mapped copy-on-write where it starts."""
    if size < MAP_THRESHOLD:
        return _read_exact(src, size)
    import mmap  # only for large buffers: a rank reading small values need not load it

    position = src.tell()
    if position % align:
        _read_exact(src, -position % align)
        position = src.tell()
    if position % mmap.ALLOCATIONGRANULARITY:  # cannot be mapped on this machine: read it
        return _read_exact(src, size)
    if os.fstat(src.fileno()).st_size < position + size:
        raise _refused(f"payload is truncated: a buffer of {size} bytes at {position} is missing")
    mapped = mmap.mmap(src.fileno(), size, flags=mmap.MAP_PRIVATE,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=position)
    src.seek(position + size)
    return memoryview(mapped)


def _check_compatible(header: dict[str, Any]) -> None:
    if header.get("format") != FORMAT_VERSION:
        raise _refused(
            f"payload format {header.get('format')} is not {FORMAT_VERSION}: the notebook and the ranks run "
            "different versions of mpi-magic; install the same version for both (or restart the kernel after "
            "upgrading it)"
        )
    theirs = header.get("python", "?")
    if theirs.split(".")[:2] != python_version().split(".")[:2]:
        raise _refused(
            f"the notebook runs Python {theirs} but this rank runs Python {python_version()}; "
            "pickled values only load under the same Python minor version: use a rank "
            "environment (or image) with Python " + ".".join(theirs.split(".")[:2])
        )


def file_digest(path: str) -> str:
    """SHA-256 of a file, read in chunks."""
    hasher = _sha256()
    with open(path, "rb") as src:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


def _sha256():
    """A SHA-256 hasher: the interpreter's own where it has one, since importing hashlib loads
    OpenSSL, which would cost the rank that writes results milliseconds on the job's critical path."""
    try:  # (the module this Python has, named: looking for one it lacks would search all of sys.path, every time)
        if sys.version_info >= (3, 12):
            from _sha2 import sha256  # type: ignore[import-not-found, unused-ignore]
        else:
            from _sha256 import sha256  # type: ignore[import-not-found, no-redef, unused-ignore]
    except ImportError:  # an interpreter built without them
        from hashlib import sha256
    return sha256()


def _refused(message: str) -> Exception:
    """The PayloadError to raise; errors is imported only when a file is refused, not on every rank's start."""
    from ..errors import PayloadError

    return PayloadError(message)


def _read_exact(src: io.RawIOBase, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = src.readinto(view[got:])
        if not n:
            raise _refused(f"payload is truncated: expected {size} more bytes, got {got}")
        got += n
    return buf
