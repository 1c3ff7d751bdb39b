"""The ``fedsched`` command line, the entry point above every other package: ``main`` dispatches
to one module per subcommand (``evaluate``, ``train``, ``export``, ``certs``, ``serve``,
``federate``), named by string in ``main.SUBCOMMANDS`` and imported only when chosen, so
``fedsched evaluate`` never loads torch or Flower. Flags derived from hyper-parameter
dataclasses come from ``fedsched.common.dataclass_flags``.

May import: every fedsched package (``common``, ``agent``, ``coordinator``, ``experiment``); no
other package imports ``fedsched.cli``.
"""
