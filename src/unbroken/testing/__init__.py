"""Test fixtures shipped with the package: fault injection as wrappers around the real
components (:mod:`unbroken.testing.faults`) and a bad code version for hot-update drills
(:mod:`unbroken.testing.updates`). Nothing in the runtime imports this package; the worker CLI
builds the wrappers from its fault flags (``faults.from_flags``)."""
