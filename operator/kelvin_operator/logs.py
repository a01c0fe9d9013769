"""kopf's per-cycle log lines at DEBUG: kelvin's decisions are the INFO lines of the operator.

kopf logs every successful handler run at INFO on its ``kopf.objects`` logger (``Timer 'node_cycle' succeeded.``
once per node per cycle: 600 lines a minute at 100 nodes and a 10 s interval; ``Validation 'gpu-memory'
succeeded.`` once per pod admitted). :class:`DemoteHandlerSuccess` turns those records into DEBUG records; failures,
retries and kopf's other messages keep their level.
"""

from __future__ import annotations

import logging

#: The logger kopf reports handler outcomes on (per object).
KOPF_OBJECTS_LOGGER = "kopf.objects"
#: How kopf words a handler's success (``f"{handler} succeeded."``).
SUCCESS_SUFFIX = " succeeded."


class DemoteHandlerSuccess(logging.Filter):
    """Lowers kopf's ``<handler> succeeded.`` records to DEBUG, dropping them unless the logger is enabled for DEBUG.

    A filter on the logger runs after the logger's own level check (made at INFO) and before any handler, kopf's
    event poster included, so the record is relabelled before anything sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not str(record.msg).endswith(SUCCESS_SUFFIX):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def demote_kopf_success() -> None:
    """Install :class:`DemoteHandlerSuccess` on kopf's objects logger (once, however often it is called)."""
    logger = logging.getLogger(KOPF_OBJECTS_LOGGER)
    if not any(isinstance(f, DemoteHandlerSuccess) for f in logger.filters):
        logger.addFilter(DemoteHandlerSuccess())
