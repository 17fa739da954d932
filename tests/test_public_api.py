"""What users may import, and what importing costs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
        "from mpi_magic.backends import default_gpus\n"
        "from mpi_magic.options import Config, parse_line\n"
        "options = parse_line(MpiMagics.mpirun_remote, '--backend sagemaker --instance-type ml.p4d.24xlarge', Config(),\n"
        "                     default_gpus)\n"
        f"print(json.dumps([options.gpus, [m for m in {HEAVY!r} if m in sys.modules]]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out.splitlines()[-1]) == [8, []]


def test_rank_runtime_imports_neither_ipython_nor_cloud_sdks(ip):
    ip.run_cell_magic("mpirun_remote", "--quiet", f"import sys\nloaded = [m for m in {['IPython', *HEAVY]!r} if m in sys.modules]")
    assert ip.user_ns["loaded"] == []


# What a rank's start-up does not need: each would cost every rank milliseconds.
NOT_AT_RANK_START = ["ast", "cloudpickle", "dataclasses", "hashlib", "inspect", "mmap", "threading", "typing"]


def test_a_rank_starts_without_modules_it_does_not_need(ip):
    ip.run_cell_magic("mpirun_remote", "--quiet", f"import sys\nloaded = [m for m in {NOT_AT_RANK_START!r} if m in sys.modules]")
    assert ip.user_ns["loaded"] == []


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
