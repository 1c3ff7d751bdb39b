"""The member's Flower side: the ClientApp (``client_app``: load, local round, reply), the round
every member runs (``round``: its typed run config, its state directory, the skeleton personalise
-> learn -> keep ``W_local`` -> decide on the upload), the ways a member learns in it
(``learners``: PPO in packing mode, credit regression in its replay twin, fine-tuning on a
deployed member's decision log, and the serving checkpoint), a member's model judged on its own
validation pods (``validation``) and the ClientApp mods for experiment knobs (``mods``).

May import: ``fedsched.common`` and ``fedsched.agent.learning`` (never ``fedsched.agent.serving``:
the decision log and the cluster profiles a member shares with the serving agent are in
``fedsched.common``).
"""
