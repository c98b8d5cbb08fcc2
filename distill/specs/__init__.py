"""Packaged reward spec files, read with :mod:`importlib.resources` (see :func:`distill.spec.load_spec`)."""
