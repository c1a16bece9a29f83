"""The one exception type for bad input: the CLI prints its message on one line and exits non-zero."""


class FSCILError(Exception):
    """A user-facing error: bad params, a missing or corrupt file, a stage run out of order.

    The message must name the offending key, file or value and fit on one line.
    """

    exit_code = 2


class TrainingDiverged(FSCILError):
    """Training left the range where its result means anything: a non-finite loss, a session whose trained model
    fits its own training rows far worse than it began, or a base training whose last epoch's mean loss is not below
    its first's. Studies and `fscil select` record such a run as diverged (a
    result: counted, not averaged) instead of stopping; a stage prints the message and writes nothing."""

    # The version of what counts as diverged, stored with every recorded refusal: 2 measures a session's fit before
    # and after training (`incremental_session.fit_loss`); 1 compared batch losses and misread feature-mixup sessions.
    # The base training's check (`base_session.not_learning`) came later under 2: it only adds refusals, so no
    # refusal stored under 2 would be accepted now; a result stored before it is not checked again.
    RULES = 2

    def record(self) -> dict:
        """What a study or selection stores for this run: the message and the rules that refused it."""
        return {"diverged": str(self).splitlines()[0], "divergence_rules": self.RULES}

    @classmethod
    def stale(cls, entry: dict) -> bool:
        """A stored refusal made under other rules: run it again, the current rules may accept it."""
        return "diverged" in entry and entry.get("divergence_rules") != cls.RULES
