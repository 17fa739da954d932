"""Every ``MPI_MAGIC_*`` environment variable a job sets or reads, named once.

The notebook's side sets them, mpirun or SageMaker carries them, and the rank runtime and the
SageMaker bootstrap read them; each side imports the name from here. Settings that
``%mpirun_config`` also takes (``MPI_MAGIC_CACHE_DIR``...) are named by ``options.Setting``.
"""

PREFIX = "MPI_MAGIC_"

# where a rank is: set for each rank by the runtime, read by mpi_magic.rank() and the others
RANK = "MPI_MAGIC_RANK"
WORLD_SIZE = "MPI_MAGIC_WORLD_SIZE"
LOCAL_RANK = "MPI_MAGIC_LOCAL_RANK"
INSTANCE = "MPI_MAGIC_INSTANCE"
INSTANCES = "MPI_MAGIC_INSTANCES"
PROCS_PER_INSTANCE = "MPI_MAGIC_PROCS_PER_INSTANCE"
MASTER_ADDR = "MPI_MAGIC_MASTER_ADDR"  # becomes MASTER_ADDR for torch.distributed, unless that is set
MASTER_PORT = "MPI_MAGIC_MASTER_PORT"

# the job
JOB = "MPI_MAGIC_JOB"  # its name; also marks every process of it, wherever it moved
EVENT_TOKEN = "MPI_MAGIC_EVENT_TOKEN"  # what makes a rank's events trusted (removed before the cell runs)
RESULTS_URI = "MPI_MAGIC_RESULTS_URI"  # SageMaker: where the ranks' results go
PAYLOAD_DIGEST = "MPI_MAGIC_PAYLOAD_DIGEST"  # SageMaker: the payload's SHA-256, pinned in the job
BOOTSTRAP_SHA256 = "MPI_MAGIC_BOOTSTRAP_SHA256"  # SageMaker: the bootstrap's, checked before it runs
CODE_SHA256 = "MPI_MAGIC_CODE_SHA256"  # SageMaker: the code archive's, checked before it is unpacked
ENV_NAMES = "MPI_MAGIC_ENV_NAMES"  # SageMaker: the names the cell's --env set, forwarded by mpirun
MPIRUN_ARGS = "MPI_MAGIC_MPIRUN_ARGS"  # SageMaker: the cell's --mpirun-args
MAX_WAIT = "MPI_MAGIC_MAX_WAIT"  # SageMaker: seconds a worker instance waits for the leader to release it
SSH_AGENT = "MPI_MAGIC_SSH_AGENT"  # SageMaker: the command mpirun reaches the other instances with
MPIRUN = "MPI_MAGIC_MPIRUN"  # the mpirun to use (also %mpirun_config mpirun=...)
STACKS_DIR = "MPI_MAGIC_STACKS_DIR"  # where each rank dumps its stack when asked (shared/stacks.py)
STACKS_EVENTS = "MPI_MAGIC_STACKS_EVENTS"  # SageMaker: each rank sends its stack as an event when signalled
RESOURCES_EVERY = "MPI_MAGIC_RESOURCES_EVERY"  # seconds between a rank's resource samples (at least 1; 0: none)

# checkpoints
CHECKPOINT_S3 = "MPI_MAGIC_CHECKPOINT_S3"  # SageMaker: the job's --checkpoint-s3, or NO_CHECKPOINTS
CHECKPOINT_DIR = "MPI_MAGIC_CHECKPOINT_DIR"  # set with --env to choose the folder yourself

# sessions
SESSION_SECRET = "MPI_MAGIC_SESSION_SECRET"  # local: how rank 0 learns the channel's secret (then removed)
SESSION_URI = "MPI_MAGIC_SESSION_URI"  # SageMaker: s3://bucket/prefix/<job>/session, where the messages are
SESSION_KEY = "MPI_MAGIC_SESSION_KEY"  # SageMaker: the public half of the notebook's key, base64
HEARTBEAT_LIMIT = "MPI_MAGIC_HEARTBEAT_LIMIT"  # SageMaker: seconds without a fresh heartbeat before the job ends
IDLE_TIMEOUT = "MPI_MAGIC_IDLE_TIMEOUT"  # SageMaker: seconds without a cell before the job ends

# the offline rehearsal of SageMaker (mpi_magic.testing)
EMULATED_HOSTS = "MPI_MAGIC_EMULATED_HOSTS"  # the emulated instances' host names, for the ssh stand-in
HOST = "MPI_MAGIC_HOST"  # the emulated instance a process runs on
EMULATOR_HOSTS = "MPI_MAGIC_EMULATOR_HOSTS"  # where the emulator runs instances: auto, test-hosts or stand-in


def names() -> dict[str, str]:
    """{constant: variable} of every name above."""
    return {key: value for key, value in globals().items() if key.isupper() and key != "PREFIX"}
