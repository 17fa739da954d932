"""A backend is what its declaration says: one registered after the magic was loaded (the scripted
one of ``mpi_magic/testing``) runs cells through the magic, with its option, its setting and its name
in the help, the checks and the errors, and no file of the package touched."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from mpi_magic.backends import registry
from mpi_magic.errors import RemoteRankError
from mpi_magic.testing import scripted


@pytest.fixture
def fourth(ip):
    registry.register(scripted.declaration())
    yield ip
    registry.unregister("scripted")


def test_a_registered_backend_runs_a_cell_through_the_magic_and_brings_its_values_back(fourth, capsys):
    fourth.user_ns["data"] = [1, 2, 3]
    fourth.run_cell_magic("mpirun_remote", "--backend scripted -i 2 -g 2 --pace 0.25 --out job",
                          "total = sum(data) * 2\nprint('sum', total)")
    assert fourth.user_ns["total"] == 12, "computed from the notebook's data, on the played ranks"
    assert "sum 12" in capsys.readouterr().out.splitlines(), "rank 0's output shown as the cell runs"
    job = fourth.user_ns["job"]
    assert (job.backend, job.world_size, [r.status for r in job.ranks]) == ("scripted", 4, ["completed"] * 4)
    assert [job.logs(rank).strip() for rank in range(4)] == ["sum 12"] * 4, "every rank's output is kept"


def test_a_registered_backends_failing_rank_is_named(fourth):
    with pytest.raises(RemoteRankError) as caught:
        fourth.run_cell_magic("mpirun_remote", "--backend scripted -g 2", "x = 1 / 0")
    assert str(caught.value).startswith("rank 0 ") and "ZeroDivisionError" in str(caught.value)


def test_a_registered_backends_option_setting_and_name_are_the_magics(fourth, capsys):
    doc = fourth.magics_manager.magics["cell"]["mpirun_remote"].__doc__
    assert "--pace SECONDS" in doc and "scripted (ranks played from a script, for tests)" in " ".join(doc.split())
    fourth.run_line_magic("mpirun_config", "scripted_pace=0.1")
    fourth.run_line_magic("mpirun_config", "")
    assert "scripted_pace" in capsys.readouterr().out
    with pytest.raises(UsageError, match=r"^--pace applies to --backend scripted only; add --backend scripted or drop "
                                         r"it$"):
        fourth.run_cell_magic("mpirun_remote", "--pace 1", "x = 1")
    with pytest.raises(UsageError, match=r"^--backend 'scriptd' is not a backend; did you mean 'scripted'\?$"):
        fourth.run_cell_magic("mpirun_remote", "--backend scriptd", "x = 1")
    with pytest.raises(UsageError, match=r"65 ranks \(1 x 65\) is more than the scripted backend runs \(64 at most"):
        fourth.run_cell_magic("mpirun_remote", "--backend scripted -g 65", "x = 1")


def test_once_unregistered_the_backend_and_its_option_are_gone(ip):
    registry.register(scripted.declaration())
    registry.unregister("scripted")
    with pytest.raises(UsageError, match="'scripted' is not a backend"):
        ip.run_cell_magic("mpirun_remote", "--backend scripted", "x = 1")
    with pytest.raises(UsageError, match="unrecognized arguments: --pace"):
        ip.run_cell_magic("mpirun_remote", "--pace 1", "x = 1")
    assert "--pace" not in ip.magics_manager.magics["cell"]["mpirun_remote"].__doc__
