"""The ``fedsched`` command line: ``main`` dispatches to one module per subcommand (``evaluate``,
``export`` and ``certs`` here; ``train``, ``serve`` and ``federate`` register from
``fedsched.agent`` and ``fedsched.coordinator``, named by string in ``main.SUBCOMMANDS`` so
nothing is imported before it is used). ``dataclass_flags`` derives a command's flags from
hyper-parameter dataclasses (names, types, defaults and help from the fields), so a setting has
one source.

May import: every ``fedsched.common`` package (``agent`` and ``coordinator`` only by name,
through ``importlib``).
"""
