"""Test fixtures shipped with the package: fault injection as wrappers around the real
components (:mod:`unbroken.testing.faults`), network partitions (:mod:`unbroken.testing.netns`)
and a bad code version for hot-update drills (:mod:`unbroken.testing.updates`). Nothing in the
runtime imports this package: a launcher that injects faults names the worker plug-in
``unbroken.testing.faults:install`` (:mod:`unbroken.runtime.hooks`)."""
