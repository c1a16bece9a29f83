"""The one exception type for bad input: the CLI prints its message on one line and exits non-zero."""


class FSCILError(Exception):
    """A user-facing error: bad params, a missing or corrupt file, a stage run out of order.

    The message must name the offending key, file or value and fit on one line.
    """

    exit_code = 2
