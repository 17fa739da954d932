"""Job folders: a cache folder that cannot be used is one sentence before anything starts, and
everything written there is private to the user whatever the umask."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess

import pytest
from IPython.core.error import UsageError

from mpi_magic import RemoteRankError

MOVE_IT = "%mpirun_config cache_dir=... or MPI_MAGIC_CACHE_DIR"


def refusal(ip, line: str = "") -> str:
    with pytest.raises(UsageError) as caught:
        ip.run_cell_magic("mpirun_remote", line, "x = 1")
    assert "\n" not in str(caught.value)
    assert "x" not in ip.user_ns
    return str(caught.value)


@contextlib.contextmanager
def immutable(path):
    """A folder that cannot be written: mode 0500 for a user, the immutable attribute for root
    (whom no mode stops); yields how the system says no. Only root on a filesystem without that
    attribute cannot have one."""
    if os.geteuid() != 0:
        os.chmod(path, 0o500)
        try:
            yield os.strerror(errno.EACCES)
        finally:
            os.chmod(path, 0o700)
        return
    try:
        made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("as root only the immutable attribute makes a folder unwritable, and chattr "
                    "(Debian's e2fsprogs) is not installed")
    if made.returncode:
        pytest.skip("as root only the immutable attribute makes a folder unwritable, and this filesystem "
                    f"refuses it: {made.stderr.strip()}")
    try:
        yield os.strerror(errno.EPERM)
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@contextlib.contextmanager
def umask(mask: int):
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def test_a_file_where_the_cache_folder_should_be(ip, cache_dir):
    with open(cache_dir, "w") as f:
        f.write("the user's own file")
    assert refusal(ip) == (f"the cache folder {cache_dir} cannot hold job folders: {cache_dir} is a file, "
                           f"not a folder; choose another with {MOVE_IT}")
    with open(cache_dir) as f:
        assert f.read() == "the user's own file"


def test_a_file_where_the_jobs_folder_should_be(ip, cache_dir):
    os.mkdir(cache_dir, 0o700)
    jobs = os.path.join(cache_dir, "jobs")
    with open(jobs, "w") as f:
        f.write("kept")
    assert refusal(ip, "--dry-run") == (f"the cache folder {cache_dir} cannot hold job folders: {jobs} is a file, "
                                        f"not a folder; choose another with {MOVE_IT}")
    assert os.path.isfile(jobs)


def test_a_cache_folder_that_cannot_be_written(ip, cache_dir):
    os.mkdir(cache_dir, 0o700)
    with immutable(cache_dir) as refused:
        message = refusal(ip)
    jobs = os.path.join(cache_dir, "jobs")
    assert message == (f"the cache folder {cache_dir} cannot hold job folders: {jobs} cannot be created "
                       f"({refused}); choose another with {MOVE_IT}")


def test_a_jobs_folder_that_cannot_be_written(ip, cache_dir):
    jobs = os.path.join(cache_dir, "jobs")
    os.makedirs(jobs, 0o700)
    with immutable(jobs):
        message = refusal(ip)
    assert message == (f"the cache folder {cache_dir} cannot hold job folders: {jobs} is not writable; "
                       f"choose another with {MOVE_IT}")
    assert os.listdir(jobs) == []


@pytest.mark.parametrize("open_folder", ["cache", "jobs"])
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702], ids=oct)
def test_a_folder_others_can_write_is_refused(ip, cache_dir, open_folder, mode):
    jobs = os.path.join(cache_dir, "jobs")
    os.makedirs(jobs, 0o700)
    folder = cache_dir if open_folder == "cache" else jobs
    os.chmod(folder, mode)
    assert refusal(ip, "--dry-run") == (
        f"{folder} can be written by other users, who could change what the ranks run; chmod 700 {folder}, "
        f"or choose another cache folder with {MOVE_IT}")
    assert os.listdir(jobs) == []


def test_a_jobs_folder_of_another_user_is_refused(ip, cache_dir):
    jobs = os.path.join(cache_dir, "jobs")
    os.makedirs(jobs, 0o700)
    os.chown(jobs, os.geteuid() + 4321, -1)
    assert refusal(ip, "--dry-run") == (
        f"{jobs} belongs to another user (uid {os.geteuid() + 4321}), who could change what the ranks run; "
        f"choose a cache folder of your own with {MOVE_IT}")


def test_everything_is_private_whatever_the_umask(ip, cache_dir):
    with umask(0):
        ip.run_cell_magic("mpirun_remote", "-g 2 --out job", "print('hi')\nv = 1\n")
    job = ip.user_ns["job"]
    assert os.listdir(os.path.join(job.job_dir, "logs")) and os.listdir(os.path.join(job.job_dir, "results"))
    modes = {}
    for folder, _, files in os.walk(cache_dir):
        modes[folder] = stat.S_IMODE(os.stat(folder).st_mode)
        modes.update({os.path.join(folder, f): stat.S_IMODE(os.stat(os.path.join(folder, f)).st_mode) for f in files})
    assert {path: mode for path, mode in modes.items() if mode != (0o700 if os.path.isdir(path) else 0o600)} == {}
    assert os.path.join(job.job_dir, "job.json") in modes


def test_the_sagemaker_job_history_is_private_whatever_the_umask(cache_dir, monkeypatch):
    from mpi_magic.backends.sagemaker.history import JOBS_RECORD, record_job

    monkeypatch.setenv("MPI_MAGIC_CACHE_DIR", cache_dir)
    with umask(0):
        record_job("job-1", "us-east-1")
    assert stat.S_IMODE(os.stat(cache_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(cache_dir, JOBS_RECORD)).st_mode) == 0o600


def test_a_finished_jobs_payload_is_removed_and_the_rest_kept(ip):
    ip.run_cell_magic("mpirun_remote", "-g 2 --quiet --out job", "v = 1\n")
    assert sorted(os.listdir(ip.user_ns["job"].job_dir)) == ["job.json", "logs", "results"]
    with pytest.raises(RemoteRankError):
        ip.run_cell_magic("mpirun_remote", "--quiet --out job", "raise ValueError('no')\n")
    assert sorted(os.listdir(ip.user_ns["job"].job_dir)) == ["job.json", "logs", "results"]


@pytest.mark.parametrize("how", ["config", "environment"])
def test_keep_payloads_keeps_them_for_debugging(ip, monkeypatch, how):
    if how == "config":
        ip.run_line_magic("mpirun_config", "keep_payloads=true")
    else:
        monkeypatch.setenv("MPI_MAGIC_KEEP_PAYLOADS", "1")
    ip.run_cell_magic("mpirun_remote", "--quiet --out job", "v = 1\n")
    assert "payload.bin" in os.listdir(ip.user_ns["job"].job_dir)


def test_keep_payloads_must_be_yes_or_no(ip):
    with pytest.raises(UsageError, match="keep_payloads must be true or false, not 'maybe'"):
        ip.run_line_magic("mpirun_config", "keep_payloads=maybe")


def test_keep_jobs_counts_the_new_folder_and_a_dry_run_removes_none(ip, cache_dir, capsys):
    ip.run_line_magic("mpirun_config", "keep_jobs=2")
    for _ in range(3):
        ip.run_cell_magic("mpirun_remote", "--quiet --out job", "pass")
    jobs = os.path.join(cache_dir, "jobs")
    assert len(os.listdir(jobs)) == 2
    assert os.path.basename(ip.user_ns["job"].job_dir) in os.listdir(jobs)
    kept = sorted(os.listdir(jobs))
    ip.run_line_magic("mpirun_config", "keep_jobs=1")
    ip.run_cell_magic("mpirun_remote", "--dry-run", "pass")
    assert sorted(os.listdir(jobs)) == kept
