"""The *learn* face: read a cluster's own metrics and history and turn them into failure
precursors, checkpoint I/O diagnosis, exclusion hot spots, retry-chain statistics, alert rules
and the numbers ``plan`` needs.

Why a package of its own: everything here is I/O — OpenMetrics files, a Prometheus server over
HTTP, kernel logs, ``sacct`` output — or presentation (the terminal summary, the HTML report, the
rules YAML). The analyses themselves are pure functions in ``unbroken.core`` (``precursors``,
``memrules``, ``ckpt_io``, ``history``, ``measured``); this package only reads, aligns and
writes around them, so the same decisions run on a synthetic cluster, on files and on a live
server.
"""
