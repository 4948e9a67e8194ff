"""Error types shared by every module.

``InputError`` is bad input (a file, an argument, a value): the CLI prints its message on one
line and exits with status 2. Any other exception is a failure (status 1).

Library code names the argument of *its own function* (``InputError("must be >= 1, got 0",
argument="k_max")`` reads ``k_max: must be >= 1, got 0``); the command layer maps the argument
to the flag that fed it (``--k-max: must be >= 1, got 0``, see :func:`specmoe.cli.main`).
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input. The message names the file or argument and what is wrong with it.

    ``argument`` (optional) is the name of the function argument that was bad; ``str(exc)``
    then reads ``"<argument>: <message>"``.
    """

    def __init__(self, message: str, *, argument: str | None = None) -> None:
        self.message = message
        self.argument = argument
        super().__init__(f"{argument}: {message}" if argument else message)

    def as_flag(self, flag: str) -> InputError:
        """The same error, naming ``flag`` (a command-line option) instead of the argument."""
        return InputError(f"{flag}: {self.message}")


def require(cond: bool, message: str, *, argument: str | None = None) -> None:
    """Raise ``InputError(message, argument=argument)`` unless ``cond`` holds."""
    if not cond:
        raise InputError(message, argument=argument)
