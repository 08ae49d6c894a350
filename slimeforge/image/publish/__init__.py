"""Publishing a built image: pushed to a registry or Amazon ECR, verified by digest, recorded.

In: a build directory's report.json (or a local image), the destination and its credentials.
Out: the image pushed (push.py through the Docker Engine for gzip layers, layerpush.py through the
registry API for zstd), the registry's own digest for every tag, publish.json and the report's
digest and references (publish.py). The wheel store pushes through push.py too.
"""
