"""Detection that touches real processes: the side-effect half of the guard.

The decisions live in :mod:`unbroken.core` (pure); this package gathers their inputs.

* :mod:`unbroken.detect.stacks` - dump every worker's Python stacks (py-spy, falling back to a
  faulthandler signal the worker registered) and localise a hang with
  :func:`unbroken.core.stacks.aggregate`.
"""
