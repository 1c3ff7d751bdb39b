"""Training the policies: the Gymnasium environment over either simulator (``env``), PPO
(``ppo``), TD3 for the weight policy (``td3``), behaviour cloning (``bc``), a whole training run
with logs and checkpoints (``training``) and ``fedsched train`` (``train_cli``).

May import: ``fedsched.common`` and ``fedsched.agent.serving.decision_log`` (the on-disk log a
run records into and fine-tunes from).
"""
