"""Ranks as one Slurm job: an allocation that ``salloc`` holds while its script starts ``mpirun`` (or
``srun``) on the notebook's machine, in it, or a batch job (``sbatch``: a session, a ``--batch`` cell);
followed through the job folder, which must be on a filesystem the nodes share."""
