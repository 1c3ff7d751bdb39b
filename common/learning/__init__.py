"""The learned policies' shared pieces: the feature builder (``features``), the networks
(``nets``: the node-scoring policy and the weight policy), checkpoints (``checkpoint``), the
scorer adapters that put a network behind the scheduler interface (``scorers``), ONNX export
(``onnx``), the record of one logged decision (``records``) and the durable on-disk log of
such decisions that the online agent appends to and training fine-tunes from (``decision_log``).

Torch is imported by ``nets``, ``checkpoint``, ``scorers`` and ``onnx``; ``features``,
``records`` and ``decision_log`` are numpy-only.

May import: ``fedsched.common.model``, ``fedsched.common.schedulers`` and ``fedsched.common.files``.
"""
