"""The simulators and the evaluation harness: packing mode (``packing``: arrivals only, the FGD
protocol), replay mode (``replay``: a discrete-event simulation with departures, usage and
churn) and ``evaluate`` (policies x seeds on one split, means with 95% intervals).

May import: ``fedsched.common.model``, ``fedsched.common.schedulers`` and
``fedsched.common.learning``.
"""
