"""The tuner's engine: trials of configurations on a model, estimates, plans and the fit to a budget.

``Trial`` is its face. Below it, by concern: ``workload`` (what a trial runs), ``results``
(what a measurement says), ``runner``, ``steps``, ``forked_ranks`` and ``rank_payload`` (measuring for real),
``estimation/`` (predictions on fake tensors) and ``planning/`` (choosing a configuration).
"""
