"""The compiled-wheel store: each compiled step's wheels kept by `steps.compiled_key`, so that a key
is compiled once and installed anywhere.

In: a stack's compiled steps and their keys, the wheels a builder/ build exported. Out: the wheels
by key in the local store or a registry (<registry>/slimeforge-compiled:<key>, pushed as publish/
pushes), and each build's plan of them (compiled_plan: use a stored key, or make it).
"""
