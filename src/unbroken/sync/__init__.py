"""The sync face's offline tools (STAR): the straggler predictor, training the ML mode selector,
the synthetic straggler load they learn from (``trace``, ``synthetic``), the straggler plan
and the ``unbroken sync`` commands.

The floors: decisions and models without learning live in ``unbroken.core.sync`` (pure); what a
worker runs with (the selector's network and its model file) in ``unbroken.runtime``
(``mlselector``, ``modelfile``); this package sits above both and nothing below imports it.
Importing the package imports nothing heavy: torch is imported by the modules that train or
load a network (``predictor``, ``selector``), not by ``journal``, ``synthetic``, ``trace`` or
``plan``.
"""
