"""The payload file: named values out of band, a digest checked before unpickling, versions."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

from mpi_magic.shared import payload
from mpi_magic.errors import PayloadError


def test_values_round_trip_with_big_buffers_out_of_band(tmp_path):
    arr = np.arange(1_000_000, dtype=np.float64)
    packed = [payload.pack("arr", arr), payload.pack("d", {"k": [1, 2]}), payload.pack("f", lambda v: v + 1)]
    assert len(packed[0].data) < 1000, "the array's bytes must not be inside the pickle"
    assert np.shares_memory(np.frombuffer(packed[0].buffers[0], dtype=arr.dtype), arr), "no copy of the array"
    assert packed[0].size >= arr.nbytes
    path = str(tmp_path / "p.bin")
    digest = payload.write(path, packed, {"source": "x"})
    bundle = payload.read(path, digest)
    values, problems = bundle.load_all()
    assert problems == {}
    assert bundle.meta == {"source": "x"}
    np.testing.assert_array_equal(values["arr"], arr)
    assert values["arr"].flags.writeable
    assert values["d"] == {"k": [1, 2]} and values["f"](1) == 2


def test_a_file_changed_after_writing_is_refused_before_unpickling(tmp_path):
    path = tmp_path / "p.bin"
    digest = payload.write(str(path), [payload.pack("x", 12345)], {})
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(PayloadError, match="does not match the digest it was submitted with"):
        payload.read(str(path), digest)


def test_truncated_or_foreign_files_are_refused(tmp_path):
    path = tmp_path / "p.bin"
    payload.write(str(path), [payload.pack("x", b"x" * 100)], {})
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(PayloadError, match="truncated"):
        payload.read(str(path))
    path.write_bytes(b"not a payload at all")
    with pytest.raises(PayloadError, match="is not an mpi_magic payload"):
        payload.read(str(path))


def _rewrite_header(path, **changes):
    raw = path.read_bytes()
    header, entries_at = payload.read_header(io.BytesIO(raw).read)
    header.update(changes)
    path.write_bytes(payload.encode_header(header) + raw[entries_at:])


def test_another_python_minor_version_is_refused_with_a_clear_message(tmp_path):
    path = tmp_path / "p.bin"
    payload.write(str(path), [payload.pack("x", 1)], {})
    _rewrite_header(path, python="2.7.18")
    with pytest.raises(PayloadError, match=r"the notebook runs Python 2\.7\.18 but this rank runs Python 3\.\d+"):
        payload.read(str(path))


def test_another_format_version_is_refused(tmp_path):
    path = tmp_path / "p.bin"
    payload.write(str(path), [payload.pack("x", 1)], {})
    _rewrite_header(path, format=99)
    with pytest.raises(PayloadError, match="payload format 99"):
        payload.read(str(path))


@pytest.mark.parametrize("umask", [0o022, 0o000, 0o277], ids=oct)
def test_the_file_is_private_whatever_the_umask(tmp_path, umask):
    path = tmp_path / "p.bin"
    path.write_bytes(b"an older file, readable by all")
    path.chmod(0o644)
    before = os.umask(umask)
    try:
        payload.write(str(path), [], {})
    finally:
        os.umask(before)
    assert path.stat().st_mode & 0o777 == 0o600


def test_large_buffers_are_mapped_copy_on_write_and_still_checked(tmp_path):
    arr = np.arange(2**20, dtype=np.int64)  # 8 MiB: above the mapping threshold
    path = tmp_path / "p.bin"
    digest = payload.write(str(path), [payload.pack("small", b"abc"), payload.pack("arr", arr)], {})
    loaded = payload.read(str(path), digest).load("arr")
    loaded[:10] = -1  # private to this process: the file keeps the original
    np.testing.assert_array_equal(payload.read(str(path), digest).load("arr"), arr)
    raw = bytearray(path.read_bytes())
    raw[-8 * 1000] ^= 0x01  # inside the mapped buffer
    path.write_bytes(bytes(raw))
    with pytest.raises(PayloadError, match="does not match the digest"):
        payload.read(str(path), digest)
    path.write_bytes(bytes(raw[:-4096]))
    with pytest.raises(PayloadError, match="truncated"):
        payload.read(str(path))


def test_without_a_digest_nothing_is_hashed_and_none_is_returned(tmp_path):
    assert payload.write(str(tmp_path / "p.bin"), [payload.pack("x", 1)], {}, digest=False) is None


def test_hashing_looks_for_no_module_once_it_has_hashed(tmp_path, monkeypatch):
    """A rank writing results, and the notebook reading them, hash with what they found the first time:
    looking for a module that this Python lacks searches every folder of sys.path, each time."""
    import sys

    payload.write(str(tmp_path / "first.bin"), [payload.pack("x", 1)], {})
    searched: list[str] = []

    class Searches:
        def find_spec(self, name, path=None, target=None):
            searched.append(name)
            return None

    monkeypatch.setattr(sys, "meta_path", [Searches(), *sys.meta_path])
    digest = payload.write(str(tmp_path / "second.bin"), [payload.pack("x", 1)], {})
    assert payload.file_digest(str(tmp_path / "second.bin")) == digest and searched == []


def test_the_header_is_read_alone_through_any_reader(tmp_path):
    """What attach does with ranged S3 reads: the header, without reading the values."""
    path = tmp_path / "p.bin"
    payload.write(str(path), [payload.pack("big", np.zeros(1 << 18))], {"returns": ["y"], "gather": True})
    raw = path.read_bytes()
    asked: list[int] = []

    def read(size: int) -> bytes:
        start = sum(asked)
        asked.append(size)
        return raw[start:start + size]

    header, entries_at = payload.read_header(read)
    assert header["meta"] == {"returns": ["y"], "gather": True}
    assert sum(asked) == entries_at < len(raw) // 100
    with pytest.raises(PayloadError, match="truncated or damaged"):
        payload.read_header(io.BytesIO(raw[:entries_at - 1]).read)
