"""The learned policies' shared pieces: the feature builder (``features``), the networks
(``nets``: the node-scoring policy and the weight policy), checkpoints (``checkpoint``), the
scorer adapters that put a network behind the scheduler interface (``scorers``), ONNX export
(``onnx``) and the record of one logged decision (``records``).

Torch is imported by ``nets``, ``checkpoint``, ``scorers`` and ``onnx``; ``features`` and
``records`` are numpy-only.

May import: ``fedsched.common.model`` and ``fedsched.common.schedulers``.
"""
