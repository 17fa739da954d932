"""Ranks as processes of one ``mpirun`` on this machine, grouped into simulated instances."""
