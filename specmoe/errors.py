"""Error types shared by every module.

``InputError`` is bad input (a file, an argument, a value): the CLI prints its message on one
line and exits with status 2. Any other exception is a failure (status 1).
"""


class InputError(ValueError):
    """Bad user input. The message names the file or argument and what is wrong with it."""


def require(cond: bool, message: str) -> None:
    """Raise ``InputError(message)`` unless ``cond`` holds."""
    if not cond:
        raise InputError(message)
