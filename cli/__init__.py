"""The `streampool` command: the one package that imports both the gateway and the worker."""
