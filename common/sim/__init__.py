"""The simulators and the evaluation harness: packing mode (``packing``: arrivals only, the FGD
protocol), replay mode (``replay``: a discrete-event simulation with departures, usage and
churn), ``evaluate`` (policies x seeds on one split, means with 95% intervals) and ``paired``
(each policy against a reference seed by seed: the comparison every verdict uses), and
``run_cache`` (baselines' runs kept between evaluations).

May import: ``fedsched.common.model``, ``fedsched.common.schedulers``,
``fedsched.common.learning``, ``fedsched.common.compute`` and ``fedsched.common.files``.
"""
