"""Ranks as one MPIJob of Kubeflow's MPI Operator per cell (not registered yet: its job and sessions come next)."""
