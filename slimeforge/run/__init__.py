"""The run pipeline: recipe -> flags -> run directory -> preflight (doctor) -> launch."""
