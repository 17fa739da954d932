"""Which names a cell reads and assigns, without running anything."""

from __future__ import annotations

import pytest

from mpi_magic.notebook.capture import analyze, capture
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
    assert code.value_at is not None
    assert analyze("f();").value_at is None
    assert analyze("f();  # done").value_at is None
    assert analyze("f()  # no; output").value_at is not None


def test_compile_time_errors_are_raised_before_anything_starts():
    with pytest.raises(SyntaxError, match="'break' outside loop"):
        analyze("break")
    analyze("import asyncio\nawait asyncio.sleep(0)")  # top-level await is fine, as in IPython


def test_only_read_names_are_packed():
    ns = {"used": 1, "unused": (i for i in range(3)), "print": print}
    captured = capture(analyze("y = used"), ns)
    assert [p.name for p in captured.packed] == ["used"]


def test_every_unpicklable_read_name_is_listed_one_sentence_each():
    import threading

    ns = {"a": threading.Lock(), "b": (i for i in range(3))}
    with pytest.raises(CaptureError) as caught:
        capture(analyze("print(a, b)"), ns)
    assert str(caught.value).splitlines() == [
        "cannot start:",
        "a (_thread.lock) cannot be sent to the ranks: TypeError: cannot pickle '_thread.lock' object; "
        "create the lock inside the cell instead, since a lock cannot be shared between processes",
        "b (generator) cannot be sent to the ranks: TypeError: cannot pickle 'generator' object; "
        "turn it into a list first (b = list(b)) or create the generator inside the cell",
    ]


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


OPEN_FILE = "an open file of this process ({!r}); pass the file's path instead and open it inside the cell"


@pytest.mark.parametrize("mode", ["r", "w", "rb", "ab"])
def test_a_function_using_an_open_file_names_it_whatever_the_mode(tmp_path, mode):
    path = tmp_path / "log.txt"
    path.write_text("the file's content")
    log = open(path, mode)

    def step(x):
        return log.read() if log.readable() else log.write(str(x))

    try:
        with pytest.raises(CaptureError) as caught:
            capture(analyze("step(1)"), {"step": step})
        assert str(caught.value) == "step (function) cannot be sent to the ranks: it uses log, " + OPEN_FILE.format(str(path))
    finally:
        log.close()


@pytest.mark.parametrize("mode", ["r", "w"])
def test_an_open_file_is_refused_as_a_value_or_inside_one(tmp_path, mode):
    path = tmp_path / "data.txt"
    path.write_text("the file's content")
    with open(path, mode) as f:
        with pytest.raises(CaptureError) as direct:
            capture(analyze("d = f.read()"), {"f": f})
        with pytest.raises(CaptureError) as held:
            capture(analyze("d = cfg['src'].read()"), {"cfg": {"src": f, "n": 1}})
    kind = type(f).__module__ + "." + type(f).__qualname__
    assert str(direct.value) == f"f ({kind}) cannot be sent to the ranks: it is " + OPEN_FILE.format(str(path))
    assert str(held.value) == "cfg (dict) cannot be sent to the ranks: it holds " + OPEN_FILE.format(str(path))


def test_the_notebooks_stderr_still_travels_as_the_ranks_own(monkeypatch):
    import os
    import pickle
    import sys

    with open(os.devnull, "w") as terminal:  # sys.stderr as a terminal IPython has it
        monkeypatch.setattr(sys, "stderr", terminal)
        err = sys.stderr

        def say(text):
            print(text, file=err)

        [packed] = capture(analyze("say(1)"), {"say": say}).packed
    monkeypatch.undo()
    assert pickle.loads(packed.data).__closure__[0].cell_contents is sys.stderr


def test_a_syntax_error_is_numbered_as_the_cell_shows_it():
    with pytest.raises(SyntaxError) as caught:
        analyze("a = 1\nb = )\n")
    assert caught.value.lineno == 3, "the %%mpirun_remote line is line 1"
