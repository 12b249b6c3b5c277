"""The sync face's side of issue 11 (STAR): the straggler predictor, the ML mode selector,
their model files, the straggler plan and the ``unbroken sync`` commands.

Decisions and models without learning live in ``unbroken.core.sync`` (pure); this package
holds what trains, reads files or needs torch. Importing the package imports nothing heavy:
torch is imported by the modules that train or load a network (``predictor``, ``selector``,
``modelfile``), not by ``journal``, ``synthetic`` or ``plan``.
"""
