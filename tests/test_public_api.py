"""What users may import, and what importing costs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import run

import mpi_magic

HEAVY = ["boto3", "botocore", "sagemaker", "pandas", "ipywidgets"]


def test_all_lists_exactly_the_public_names():
    # dir(): the names imported on first use too; TYPE_CHECKING is the type checkers' flag
    public = {name for name in dir(mpi_magic) if not name.startswith("_") and name != "TYPE_CHECKING"}
    modules = {name for name in public if type(getattr(mpi_magic, name)).__name__ == "module"}
    assert set(mpi_magic.__all__) == public - modules
    for name in mpi_magic.__all__:
        assert getattr(mpi_magic, name).__doc__, f"{name} needs a docstring"


def test_import_and_load_ext_stay_light():
    code = (
        "import sys, json\n"
        "import mpi_magic\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "InteractiveShell.instance().run_line_magic('load_ext', 'mpi_magic')\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out.splitlines()[-1]) == []


def test_parsing_sagemaker_options_imports_no_cloud_sdk():
    """The GPU table behind the default --gpus is read without loading botocore."""
    code = (
        "import sys, json\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "InteractiveShell.instance().run_line_magic('load_ext', 'mpi_magic')\n"
        "from mpi_magic.magic import MpiMagics\n"
        "from mpi_magic.backends import registry\n"
        "options = registry.parse_line(MpiMagics.mpirun_remote, '--backend sagemaker --instance-type ml.p4d.24xlarge',\n"
        "                              registry.config())\n"
        f"print(json.dumps([options.gpus, [m for m in {HEAVY!r} if m in sys.modules]]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out.splitlines()[-1]) == [8, []]


def test_rank_runtime_imports_neither_ipython_nor_cloud_sdks(ip):
    ip.run_cell_magic("mpirun_remote", "--quiet", f"import sys\nloaded = [m for m in {['IPython', *HEAVY]!r} if m in sys.modules]")
    assert ip.user_ns["loaded"] == []


# What a rank imports for a trivial cell, beyond what Python itself starts with: every module costs
# each rank a share of a millisecond or more, before its cell runs. What only some cells use (a value's
# unpickling, a notebook function, get_ipython(), a failure's traceback, tqdm) is imported when used.
RANK_MODULES = {"mpi_magic", "mpi_magic.runtime", "mpi_magic.runtime.on_import", "mpi_magic.runtime.rank",
                "mpi_magic.runtime.resources", "mpi_magic.runtime.tqdm_hook", "mpi_magic.shared", "mpi_magic.shared.cell",
                "mpi_magic.shared.envvars", "mpi_magic.shared.fabric", "mpi_magic.shared.layout",
                "mpi_magic.shared.payload", "mpi_magic.shared.procs", "mpi_magic.shared.reporting",
                "mpi_magic.shared.stacks", "mpi_magic.shared.wire"}
# The standard modules those need, with what these import in turn: ``python -m`` (runpy), the payload's
# framing (struct), the events and the payload's header (json's C part: the json package costs milliseconds),
# dying with the launcher (ctypes: prctl), stacks on demand (faulthandler), the resource sampler's stop (atexit),
# the collector told what the runtime loaded (gc).
RANK_STANDARD_MODULES = ["__future__", "runpy", "struct", "_json", "ctypes", "faulthandler", "atexit", "gc"]


def test_a_trivial_cell_imports_on_its_rank_only_what_every_cell_needs(ip):
    listing = "import sys\nnames = sorted(sys.modules)\nimport json\nprint(json.dumps(names))\n"
    bare = subprocess.run([sys.executable, "-c", listing], capture_output=True, text=True, timeout=60,
                          check=True).stdout
    needed = subprocess.run([sys.executable, "-c", f"import {', '.join(RANK_STANDARD_MODULES)}\n{listing}"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    ip.run_cell_magic("mpirun_remote", "--quiet", "import sys\nloaded = sorted(sys.modules)")
    loaded = set(ip.user_ns["loaded"]) - set(json.loads(bare))
    assert {name for name in loaded if name.startswith("mpi_magic")} == RANK_MODULES
    assert sorted(loaded - RANK_MODULES - set(json.loads(needed))) == []


def test_the_collector_on_a_rank_leaves_the_runtime_alone_and_collects_what_the_cell_makes(ip):
    """What the runtime loaded lives as long as the rank, so the garbage collector need not walk it again in
    every collection of the cell and at the rank's end (nor run while the runtime starts); the cell's own
    garbage is collected as ever."""
    cell = ("import gc, weakref\n"
            "enabled, frozen = gc.isenabled(), gc.get_freeze_count()\n"
            "class Node:\n    pass\n"
            "node = Node()\nnode.cycle = node\nalive = weakref.ref(node)\ndel node\n"
            "gc.collect()\n"
            "collected = alive() is None\n"
            "del Node, alive\n")
    run(ip, "-g 1 --quiet", cell)
    assert ip.user_ns["enabled"] and ip.user_ns["frozen"] > 1000 and ip.user_ns["collected"]


def test_rank_info_outside_a_job():
    assert (mpi_magic.rank(), mpi_magic.world_size(), mpi_magic.local_rank(), mpi_magic.instance(),
            mpi_magic.num_instances()) == (0, 1, 0, 0, 1)


def test_checkpoint_dir_on_a_sagemaker_job_is_its_checkpoint_channel_or_a_sentence_saying_how_to_get_one(
        tmp_path, monkeypatch):
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path))
    monkeypatch.setenv("MPI_MAGIC_CHECKPOINT_S3", "s3://bucket/checkpoints")
    assert mpi_magic.checkpoint_dir() == str(tmp_path / "checkpoints") and (tmp_path / "checkpoints").is_dir()
    monkeypatch.setenv("MPI_MAGIC_CHECKPOINT_S3", "none")  # a job started without --checkpoint-s3
    with pytest.raises(RuntimeError, match=r"^this SageMaker job keeps no checkpoints: add --checkpoint-s3 s3://"):
        mpi_magic.checkpoint_dir()
    monkeypatch.setenv("MPI_MAGIC_CHECKPOINT_DIR", str(tmp_path / "mine"))  # the user's choice wins
    assert mpi_magic.checkpoint_dir() == str(tmp_path / "mine")
