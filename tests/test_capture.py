"""Which names a cell reads and assigns, without running anything."""

from __future__ import annotations

import pytest

from mpi_magic.capture import analyze, capture
from mpi_magic.errors import CaptureError


@pytest.mark.parametrize(("source", "reads"), [
    ("x += 1", {"x"}),
    ("x = 0\nx += 1", set()),
    ("x = 1\nprint(x)", {"print"}),
    ("print(x)\nx = 2", {"print", "x"}),
    ("with open(p) as f:\n    d = f.read()", {"open", "p"}),
    ("for i in items:\n    total = total + i", {"items", "total"}),
    ("def g():\n    return y\ny = 1", {"y"}),  # g may be called before y is assigned
    ("y = 1\ndef g():\n    return y", set()),
    ("def bump():\n    global counter\n    counter += 1\nbump()", {"counter"}),
    ("del a", {"a"}),
    ("a = 1\ndel a", set()),
    ("match cmd:\n    case _:\n        total += 1", {"cmd", "total"}),
    ("match v:\n    case [chunk, *rest] if chunk > lim:\n        pass\n    case Point(x=0) | Color.RED:\n        pass",
     {"v", "lim", "Point", "Color"}),
    ("if (n := 3) > 0:\n    r = n", set()),
    ("def g():\n    return z", {"z"}),
    ("class A(Base):\n    k = c", {"Base", "c"}),
    ("[a for a in b if a > lim]", {"b", "lim"}),
    ("import numpy as np\nnp.ones(3)", set()),
    ("if c:\n    v = 1\nelse:\n    v = 2\nprint(v)", {"c", "print"}),
    ("if c:\n    v = 1\nprint(v)", {"c", "print", "v"}),
    ("f = lambda: zz\nf()", {"zz"}),
    ("a[i] = j", {"a", "i", "j"}),
    ("try:\n    w = 1\nexcept Err as e:\n    print(e)", {"Err", "print"}),
])
def test_reads_are_names_used_before_the_cell_defines_them(source, reads):
    assert analyze(source).reads == reads


def test_assigns_are_every_top_level_binding_in_order():
    code = analyze("import os\nx = 1\nfor i in range(2):\n    pass\ndef f():\n    global g\n    g = 2\nclass C:\n    pass\nf()")
    assert code.assigns == ["os", "x", "i", "f", "C", "g"]
    assert code.ends_with_expression and code.display_result
    assert not analyze("f();").display_result
    assert not analyze("f();  # done").display_result
    assert analyze("f()  # no; output").display_result


def test_compile_time_errors_are_raised_before_anything_starts():
    with pytest.raises(SyntaxError, match="'break' outside loop"):
        analyze("break")
    analyze("import asyncio\nawait asyncio.sleep(0)")  # top-level await is fine, as in IPython


def test_only_read_names_are_packed():
    ns = {"used": 1, "unused": (i for i in range(3)), "print": print}
    captured = capture(analyze("y = used"), ns)
    assert [p.name for p in captured.packed] == ["used"]


def test_every_unpicklable_read_name_is_listed():
    import threading

    ns = {"a": threading.Lock(), "b": (i for i in range(3))}
    with pytest.raises(CaptureError) as caught:
        capture(analyze("print(a, b)"), ns)
    lines = str(caught.value).splitlines()
    assert lines[0] == "cannot start:"
    assert lines[1].startswith("a (_thread.lock) cannot be sent to the ranks: TypeError: cannot pickle '_thread.lock' object")
    assert lines[2].startswith("b (generator) cannot be sent to the ranks:")


def test_large_values_are_reported_by_name_and_size():
    import numpy as np

    ns = {"big": np.zeros(5 * 2**20), "small": np.zeros(10)}
    captured = capture(analyze("x = big.sum() + small.sum()"), ns)
    [(name, kind, size)] = captured.large_values()
    assert (name, kind) == ("big", "ndarray")
    assert ns["big"].nbytes <= size < ns["big"].nbytes + 1024


def test_in_memory_streams_travel_but_files_do_not():
    import io

    assert [p.name for p in capture(analyze("d = buf.getvalue()"), {"buf": io.BytesIO(b"abc")}).packed] == ["buf"]


def test_a_function_that_cannot_travel_names_what_it_uses(tmp_path):
    log = open(tmp_path / "log.txt", "w")

    def step(x):
        log.write(str(x))

    try:
        with pytest.raises(CaptureError) as caught:
            capture(analyze("step(1)"), {"step": step})
        assert str(caught.value) == (
            "step (function) cannot be sent to the ranks: it uses log (_io.TextIOWrapper), which cannot be sent: "
            "a file handle belongs to this process. Pass the file's path instead and open it inside the cell")
    finally:
        log.close()
