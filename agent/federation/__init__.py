"""The member's Flower side: the ClientApp (``client_app``: load, local round, reply), its task
module (``task``: the member's state directory, one local round of PPO or of fine-tuning on its
decision log, the serving checkpoint) and the ClientApp mods for experiment knobs (``mods``).

May import: ``fedsched.common``, ``fedsched.agent.learning`` and ``fedsched.agent.serving``.
"""
