"""Real training: a small MLP trained with DistributedDataParallel (gloo, CPU, fixed seeds) on 4 ranks
for a fixed number of steps, through the magic and through the launchers an ML engineer would use.

The rows take turns in each round, and torchrun is the baseline of the ratios:

- a one-off ``%%mpirun_remote`` cell on 1 instance x 4 ranks, and on 2 x 2;
- a cell on a warm 4-rank session (1 x 4), its process group up since the session's first cell;
  the session's start and that first cell (torch imported, the group made, a first training) are
  reported apart;
- torchrun: ``python -m torch.distributed.run --nproc-per-node 4`` running the same function,
  written to a script;
- accelerate's ``notebook_launcher(num_processes=4)``, where accelerate is installed.

Every row runs the one ``train`` below (the others through ``run_training``, which makes and ends
the process group around it), and the weights every row and round trained must be
bit-identical (the same world size, seeds and gloo reduction order), or the benchmark stops saying
which differ. Needs PyTorch (the CPU build is enough); ``pip install accelerate`` for its row.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import io
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from _common import interleaved, median, shell

import numpy as np
import psutil

from mpi_magic.shared import procs

WORLD_SIZE = 4
ONE_OFF_CELL = "weights = run_training(steps)"
# A session's process group is made once and stays up between its cells, as its ranks do: torch
# cannot make the default group again on the same MASTER_PORT in one process (the first group's
# store stays up in rank 0 and the new group's rendezvous reads its keys: the first collective hangs).
SESSION_FIRST_CELL = "import torch.distributed as dist\ndist.init_process_group('gloo')\nweights = train(steps)"
SESSION_ROW = "warm session cell (1 x 4)"
TORCHRUN_ROW = "torchrun --nproc-per-node 4"
TORCH_MISSING = ("bench_ddp.py needs PyTorch, which is not installed: "
                 "pip install torch --index-url https://download.pytorch.org/whl/cpu")


def train(steps: int) -> dict:
    """The training every row runs, on the default process group; returns the trained weights as
    numpy arrays. Every rank draws the same batches from a seeded generator and trains on its own
    share of each."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)  # one core per rank, and the same arithmetic on every row
    rank, world_size = dist.get_rank(), dist.get_world_size()
    data = torch.Generator().manual_seed(0)
    features = torch.randn(8192, 32, generator=data)
    targets = torch.sin(features @ torch.randn(32, 1, generator=data))
    torch.manual_seed(1)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = torch.Generator().manual_seed(2)
    for _ in range(steps):
        batch = torch.randint(len(features), (32 * world_size,), generator=batches)[rank::world_size]
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(features[batch]), targets[batch]).backward()  # DDP averages here
        optimizer.step()
    return {name: value.detach().numpy().copy() for name, value in model.module.state_dict().items()}


def run_training(steps: int) -> dict:
    """One launch's whole run: the process group set up (gloo, from the launcher's environment),
    ``train``, and the group torn down."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    weights = train(steps)
    dist.destroy_process_group()
    return weights


def train_and_save(steps: int, path: str) -> None:
    """``run_training``, its weights written by rank 0: what a launcher that returns nothing needs."""
    import os
    import pickle

    weights = run_training(steps)
    if os.environ["RANK"] == "0":
        with open(path, "wb") as file:
            pickle.dump(weights, file)


def load(path: str) -> dict:
    with open(path, "rb") as file:
        return pickle.load(file)


def magic_cell(ip, line: str, cell: str) -> Callable[[], dict]:
    """A ``%%mpirun_remote`` cell that assigns ``weights``; rank 0's come back."""
    def run() -> dict:
        ip.run_cell_magic("mpirun_remote", f"{line} --quiet", cell)
        return ip.user_ns.pop("weights")

    return run


def torchrun(folder: str, steps: int) -> Callable[[], dict]:
    """torchrun running ``train_and_save`` from a script, on a port of its own."""
    script, path = os.path.join(folder, "train_ddp.py"), os.path.join(folder, "torchrun_weights.pkl")
    with open(script, "w") as file:
        file.write("\n\n".join(inspect.getsource(function) for function in (train, run_training, train_and_save))
                   + f"\n\nif __name__ == '__main__':\n    train_and_save({steps}, {path!r})\n")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD_SIZE),
            "--master-port", str(procs.free_port()), script]

    def run() -> dict:
        finished = subprocess.run(argv, capture_output=True, text=True)
        if finished.returncode != 0:
            raise SystemExit(f"torchrun failed (exit status {finished.returncode}):\n{finished.stderr}")
        return load(path)

    return run


def notebook_launcher(folder: str, steps: int) -> Callable[[], dict]:
    """accelerate's ``notebook_launcher`` forking this process into the ranks of ``train_and_save``."""
    from accelerate import notebook_launcher as launch

    path, port = os.path.join(folder, "accelerate_weights.pkl"), str(procs.free_port())

    def run() -> dict:
        with contextlib.redirect_stdout(io.StringIO()):  # "Launching training on 4 CPUs."
            launch(train_and_save, (steps, path), num_processes=WORLD_SIZE, use_port=port)
        return load(path)

    return run


def identical(first: dict, other: dict) -> str | None:
    """Why two sets of weights are not bit-identical, or None when they are."""
    if first.keys() != other.keys():
        return f"different parameters: {sorted(first)} and {sorted(other)}"
    for name in first:
        if first[name].tobytes() != other[name].tobytes():
            gap = float(np.abs(first[name] - other[name]).max())
            return f"{name} differs by up to {gap:.3g}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="rounds, each row once per round")
    parser.add_argument("--steps", type=int, default=600, help="training steps of every run")
    args = parser.parse_args()
    if importlib.util.find_spec("torch") is None:
        print(TORCH_MISSING)
        return
    ip = shell()
    ip.user_ns["steps"] = args.steps
    # defined in the notebook, as a user's earlier cell would, and sent with the cells that call them
    ip.run_cell("\n\n".join(inspect.getsource(function) for function in (train, run_training)))
    rows: dict[str, Callable[[], dict]] = {
        "%%mpirun_remote -i 1 -g 4": magic_cell(ip, f"--no-session -i 1 -g {WORLD_SIZE}", ONE_OFF_CELL),
        "%%mpirun_remote -i 2 -g 2": magic_cell(ip, f"--no-session -i 2 -g {WORLD_SIZE // 2}", ONE_OFF_CELL),
        SESSION_ROW: magic_cell(ip, "", "weights = train(steps)"),
    }
    with tempfile.TemporaryDirectory(prefix="mpi_magic_bench_ddp_") as folder:
        rows[TORCHRUN_ROW] = torchrun(folder, args.steps)
        if importlib.util.find_spec("accelerate") is not None:
            rows["accelerate notebook_launcher"] = notebook_launcher(folder, args.steps)
        began = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            ip.run_line_magic("mpirun_session", f"start -i 1 -g {WORLD_SIZE} --quiet")
        try:
            first_weights = magic_cell(ip, "", SESSION_FIRST_CELL)()
            first_cell = time.perf_counter() - began
            trained: dict[str, list[dict]] = {name: [] for name in rows}
            times = interleaved([lambda name=name, run=run: trained[name].append(run())
                                 for name, run in rows.items()], args.repeats)
            ip.run_cell_magic("mpirun_remote", "--quiet", "dist.destroy_process_group()")
        finally:
            with contextlib.redirect_stdout(io.StringIO()):
                ip.run_line_magic("mpirun_session", "stop")
    check_weights(first_weights, trained)
    report(dict(zip(rows, times)), first_cell, args)
    left = psutil.Process().children(recursive=True)
    if left:
        raise SystemExit(f"processes left running after the benchmark: {[p.pid for p in left]}")


def check_weights(reference: dict, trained: dict[str, list[dict]]) -> None:
    """Every row's and round's weights against the session's first cell's; stops at the first that differs."""
    for name, runs in trained.items():
        for round_number, weights in enumerate(runs, 1):
            why = identical(reference, weights)
            if why is not None:
                raise SystemExit(f"{name}, round {round_number}, trained other weights than the first run: {why}")


def report(times: dict[str, list[float]], first_cell: float, args) -> None:
    baseline = median(times[TORCHRUN_ROW])
    print(f"DDP training, {WORLD_SIZE} ranks (gloo, CPU), {args.steps} steps, "
          f"median of {args.repeats} rounds, the rows taking turns in each:")
    for name, spent in times.items():
        print(f"  {name:<32} {median(spent):7.3f} s ({min(spent):.3f}-{max(spent):.3f})   "
              f"ratio to torchrun {median(spent) / baseline:.2f}")
    if "accelerate notebook_launcher" not in times:
        print("  accelerate not installed: pip install accelerate for the notebook_launcher row")
    print(f"  the session's start and first cell (torch imported, the process group made, a first training) "
          f"{first_cell:.3f} s")
    warm = median(times[SESSION_ROW])
    others = {name: median(spent) for name, spent in times.items() if name != SESSION_ROW}
    fastest = min(others, key=others.__getitem__)
    verdict = "beats" if warm < others[fastest] else "does not beat"
    print(f"  the warm session cell {verdict} every other row: {warm:.3f} s vs {fastest} {others[fastest]:.3f} s "
          f"(ratio {warm / others[fastest]:.2f})")
    print("  trained weights bit-identical across every row and round")


if __name__ == "__main__":
    main()
