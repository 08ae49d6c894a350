"""The image pipeline: stack -> steps/plan -> lock -> Dockerfile (build) or install.sh (install) -> patches -> wheel store -> publish."""
