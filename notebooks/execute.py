"""Execute the notebooks in a real kernel and store them as they ran.

    python notebooks/execute.py [NOTEBOOK ...]      (all of them without arguments; ./dev.sh notebooks)

Outputs are stored only for cells tagged ``raises-exception`` (a failure shown on purpose, which
teaches more than a description would); every other output is dropped. Each notebook's metadata
keeps the digest of the code cells that ran (``mpi_magic.code_digest``), so a test can tell a
notebook edited after its last execution.

The SageMaker cells run against the rehearsal cloud (``mpi_magic.testing.local_aws``: a moto
server and the SageMaker emulator on loopback), chosen by the documented ``MPI_MAGIC_*`` settings
and ``AWS_ENDPOINT_URL_*`` variables, at the sizes in ``REHEARSAL_SIZES``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time


HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOKS = sorted(name for name in os.listdir(HERE) if name.endswith(".ipynb"))
KEEP_OUTPUT = "raises-exception"
# how big the SageMaker notebook's jobs are when rehearsed on this machine (4 x 8 on AWS)
REHEARSAL_SIZES = {"sagemaker_multinode.ipynb": {"MPI_MAGIC_INSTANCES": "2", "MPI_MAGIC_GPUS": "2"}}


def code_digest(nb) -> str:
    """SHA-256 of the notebook's code cells, in order."""
    sources = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    return hashlib.sha256(json.dumps(sources).encode()).hexdigest()


def keeps_output(cell) -> bool:
    return KEEP_OUTPUT in cell.get("metadata", {}).get("tags", [])


def rehearsal_settings(env: dict[str, str]) -> dict[str, str]:
    """``env`` and the ``MPI_MAGIC_*`` settings for SageMaker jobs on the rehearsal cloud it points at
    (``mpi_magic.testing.local_aws``: its bucket, role and image), on instances of four GPUs."""
    from mpi_magic.testing.local_aws import rehearsal_settings as cloud_settings

    return {**env, **cloud_settings(env), "MPI_MAGIC_INSTANCE_TYPE": "ml.g5.12xlarge"}


def run(path: str, env: dict[str, str], cwd: str, timeout: int = 300):
    """Execute the notebook at ``path`` in a fresh python3 kernel with ``env`` added; return it."""
    import nbformat  # here, not above: the tests import this module, and nbformat takes seconds to import
    from nbclient import NotebookClient
    from traitlets.config import Config

    nb = nbformat.read(path, as_version=4)
    env = {**env, **REHEARSAL_SIZES.get(os.path.basename(path), {})}
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        with tempfile.TemporaryDirectory(prefix="mpi_magic_kernel_") as sockets:
            # the kernel's channels are sockets in a folder of its own, not TCP ports: a port Jupyter
            # found free can be taken by another process before the kernel binds it
            channels = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets, "kernel")}})
            NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": cwd}},
                           config=channels).execute()
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
    return nb


def stored_form(nb):
    """The notebook as the repository keeps it: outputs only where they teach, and the digest."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.execution_count = None
            if not keeps_output(cell):
                cell.outputs = []
            for output in cell.outputs:
                if "execution_count" in output:
                    output["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
    nb.metadata.pop("widgets", None)
    nb.metadata["mpi_magic"] = {"code_digest": code_digest(nb)}
    return nb


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Execute the demo notebooks (or those named) on the local backend "
                                                 "and the rehearsal cloud, and store each as it ran.")
    parser.add_argument("names", nargs="*", metavar="NOTEBOOK", help=f"one of {', '.join(NOTEBOOKS)}; all if none")
    names = parser.parse_args(argv).names
    unknown = [name for name in names if os.path.basename(name) not in NOTEBOOKS]
    if unknown:
        parser.error(f"{unknown[0]} is not one of the notebooks: {', '.join(NOTEBOOKS)}")

    import nbformat

    from mpi_magic.testing.local_aws import local_aws

    with tempfile.TemporaryDirectory(prefix="mpi_magic_notebooks_") as work:
        env = {"MPI_MAGIC_CACHE_DIR": os.path.join(work, "cache"), "MPI_MAGIC_VIEW": "text"}
        with local_aws(root=os.path.join(work, "aws")) as aws:
            cloud = rehearsal_settings(aws)
            for name in names or NOTEBOOKS:
                path = os.path.join(HERE, os.path.basename(name))
                started = time.monotonic()
                nb = run(path, {**env, **cloud}, work)
                nbformat.write(stored_form(nb), path)
                print(f"{os.path.basename(path)}: executed in {time.monotonic() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
