"""Open MPI's libfabric transports left out where a node has no fabric device, as mpirun's
arguments (SageMaker's bootstrap) and as a batch script's lines (Slurm), run by bash."""

from __future__ import annotations

import subprocess

from mpi_magic.shared import fabric


def _classes(tmp_path, *devices: str) -> list[str]:
    """Two device classes under ``tmp_path``, with ``devices`` ("infiniband/mlx5_0") in them."""
    for device in devices:
        (tmp_path / device).mkdir(parents=True)
    return [str(tmp_path / "infiniband"), str(tmp_path / "cxi")]


def test_without_a_device_libfabric_is_left_out_unless_the_user_chose_a_transport(tmp_path):
    classes = _classes(tmp_path)
    assert not fabric.has_device(classes)
    assert fabric.mca_args([], {}, classes) == ["--mca", "btl", "^ofi", "--mca", "mtl", "^ofi"]
    # a parameter of the same framework is not a choice of its transports
    assert fabric.mca_args(["--mca", "btl_tcp_if_include", "eth0"], {}, classes) == fabric.mca_args([], {}, classes)
    assert fabric.mca_args(["--mca", "btl", "self,tcp"], {}, classes) == ["--mca", "mtl", "^ofi"]
    assert fabric.mca_args([], {"OMPI_MCA_mtl": "ofi"}, classes) == ["--mca", "btl", "^ofi"]


def test_a_device_in_either_class_keeps_libfabric(tmp_path):
    for device in ("infiniband/efa_0", "cxi/cxi0"):
        classes = _classes(tmp_path / device.split("/")[0], device)
        assert fabric.has_device(classes) and fabric.mca_args([], {}, classes) == []


def _exported(tmp_path, classes: list[str], **environ: str) -> str:
    script = fabric.shell_lines(classes) + '\necho "btl=${OMPI_MCA_btl-} mtl=${OMPI_MCA_mtl-}"\n'
    return subprocess.run(["bash", "-c", script], env=environ, capture_output=True, text=True, check=True).stdout.strip()


def test_a_batch_script_decides_on_its_node_and_keeps_what_the_job_set(tmp_path):
    assert _exported(tmp_path, _classes(tmp_path / "bare")) == "btl=^ofi mtl=^ofi"
    assert _exported(tmp_path, _classes(tmp_path / "bare"), OMPI_MCA_btl="self,sm,tcp") == "btl=self,sm,tcp mtl=^ofi"
    # one class with a device and the other without is a node with a fabric
    assert _exported(tmp_path, _classes(tmp_path / "ib", "infiniband/mlx5_0")) == "btl= mtl="
