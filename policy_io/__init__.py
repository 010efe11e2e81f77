"""The edge between the pure policy and the world: files, settings, cached verification.

The core (`inference_policy`) takes bytes, keys and the clock as arguments. Everything that reads a
file, an environment variable or the packaged catalog lives here, shared by the servers and the
owner CLI so they build the same planning context from the same inputs.
"""
