"""Open MPI's libfabric transports left out where a node has no fabric device, as mpirun's
arguments (SageMaker's bootstrap) and by each rank on its own node as it starts."""

from __future__ import annotations

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


def test_a_rank_decides_on_its_own_node_and_keeps_what_the_job_set(tmp_path):
    bare = _classes(tmp_path / "bare")
    environ: dict[str, str] = {}
    fabric.leave_out(environ, bare)
    assert environ == {"OMPI_MCA_btl": "^ofi", "OMPI_MCA_mtl": "^ofi"}
    environ = {"OMPI_MCA_btl": "self,sm,tcp"}  # (mpirun's --mca btl self,sm,tcp arrives in a rank as this)
    fabric.leave_out(environ, bare)
    assert environ == {"OMPI_MCA_btl": "self,sm,tcp", "OMPI_MCA_mtl": "^ofi"}
    # one class with a device and the other without is a node with a fabric
    environ = {}
    fabric.leave_out(environ, _classes(tmp_path / "ib", "infiniband/mlx5_0"))
    assert environ == {}
