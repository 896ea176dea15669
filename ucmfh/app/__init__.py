"""The program on top of the library: the ``ucmfh`` command, whole runs, their results, grids.

Nothing in ``ucmfh`` outside this package imports from it; environment
variables are read here and passed down as arguments.
"""
