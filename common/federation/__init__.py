"""Federation pieces shared by the hub and the members: the INT8 weight codec with error feedback
and the personalised mix (``codec``), weight dictionaries to and from modules and ``.npz``
files (``weights``), weights as a scheduler scored the way every part of the federation scores
them (``scoring``), the Flower run config with its one set of defaults (``run_config``) and the
simulated member clusters (``members``).

May import: ``fedsched.common.model`` and ``fedsched.common.learning``; not Flower's runtime
(the ClientApp and the ServerApp live in ``fedsched.agent.federation`` and
``fedsched.coordinator``).
"""
