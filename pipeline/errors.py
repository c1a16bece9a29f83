"""The one exception type for bad input: the CLI prints its message on one line and exits non-zero."""


class FSCILError(Exception):
    """A user-facing error: bad params, a missing or corrupt file, a stage run out of order.

    The message must name the offending key, file or value and fit on one line.
    """

    exit_code = 2


class TrainingDiverged(FSCILError):
    """Training left the range where its result means anything: a non-finite loss, or a session whose loss ended
    far above where it started. Studies and `fscil select` record such a run as diverged (a result: counted, not
    averaged) instead of stopping; a stage prints the message and writes nothing."""
