"""Training the policies: the Gymnasium environment over either simulator (``env``), PPO
(``ppo``), TD3 for the weight policy (``td3``), behaviour cloning (``bc``), a whole training run
with logs and checkpoints (``training``; the ``fedsched train`` command is ``fedsched.cli.train``),
credit regression on each decision's node credit (``credit``), the online policy's recipe over
every member profile (``online``), the merge of several trainings into one policy scoring with
their mean logits (``ensemble``) and rollout-based policy improvement in packing mode
(``rollout_improve``).

May import: ``fedsched.common`` only (the on-disk decision log a run records into and fine-tunes
from is ``fedsched.common.learning.decision_log``).
"""
