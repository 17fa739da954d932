"""Ways to show a running job. Views read events; they never import a backend."""
