"""The warnings a run raised: Python warnings and the libraries' logged warnings, deduplicated with counts.

A backend that silently ignores a setting usually says so only here (transformers: min_p "might not be
supported" by continuous batching), and a reader must see it beside that backend's verdicts: a difference
it causes is a confound, not a finding about the rollout engine.
"""

import logging
import warnings

MESSAGE_CHARS = 400


class WarningLog:
    """Within `with WarningLog() as log:`, every warning is counted in `log.counts` and still shown once."""

    def __init__(self):
        self.counts: dict[tuple[str, str], int] = {}

    def _add(self, source: str, message: str) -> bool:
        key = (source, " ".join(str(message).split())[:MESSAGE_CHARS])
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key] == 1

    def __enter__(self):
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("always")  # count every occurrence ...
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if self._add(f"python:{category.__name__}", message):  # ... but show each one once, as usual
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        # Every logger's warnings, also of loggers that keep their records to themselves (transformers'
        # "ContinuousBatchingLogger" does): Logger.handle sees each record once, where it was logged.
        log, handle = self, logging.Logger.handle
        self._handle = handle

        def counting_handle(logger, record):
            if record.levelno >= logging.WARNING and not logger.disabled:
                log._add(f"log:{record.name.split('.')[0]}", record.getMessage())
            return handle(logger, record)

        logging.Logger.handle = counting_handle
        return self

    def __exit__(self, *exc):
        logging.Logger.handle = self._handle
        self._catch.__exit__(*exc)
        return False

    def records(self) -> list[dict]:
        """As the statistics file keeps them: source, message and count, in the order first raised."""
        return [{"source": source, "message": message, "count": count} for (source, message), count in self.counts.items()]
