"""The cluster pipeline: inventory -> ssh / Slurm -> node agent -> Ray cluster (host table)."""
