"""Ranks as one Slurm batch job: ``sbatch`` of a script that starts ``mpirun`` (or ``srun``) inside
the allocation, followed through the job folder, which must be on a filesystem the nodes share."""
