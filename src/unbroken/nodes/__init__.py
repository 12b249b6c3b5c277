"""Many machines: one node agent per machine (:mod:`unbroken.nodes.agent`) and the
coordinator's view of them (:mod:`unbroken.nodes.cluster`)."""
