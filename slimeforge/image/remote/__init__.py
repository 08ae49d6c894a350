"""Registries over the network, as much as the lock, the wheel store and publishing need.

In: a registry host, a repository, credentials. Out: what a tag points at and blobs
(registry.py: the v2 HTTP API), ECR's login token and repository settings (ecr.py), the login
`docker login` stored (credentials.py), which host is reached how and where a password may go
(hosts.py). Of image/ it reads only the reference grammar (imageref).
"""
