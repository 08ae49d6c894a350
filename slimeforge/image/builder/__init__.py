"""Building a stack: the same steps rendered as a Dockerfile (an image) or as install.sh (a host).

In: a Stack, its lock (lock/), the patches and local sources, the compiled-wheel store's plan
(wheels/). Out: a build directory (the Dockerfile from dockerfile.py, context/ written by
buildkit.py), the image BuildKit built, smoke-tested and tagged (engine.py), and report.json
(buildreport.py), or the bare-metal install script and its run (install.py). The top of image/:
nothing else in image/ imports it.
"""
