"""kopf's per-cycle log lines at DEBUG: kelvin's decisions are the INFO lines of the operator.

kopf logs every successful handler run at INFO on its ``kopf.objects`` logger (``Timer 'node_cycle' succeeded.``
once per node per cycle: 600 lines a minute at 100 nodes and a 10 s interval; ``Validation 'gpu-memory'
succeeded.`` once per pod admitted). :class:`DemoteHandlerSuccess` turns those records into DEBUG records; failures,
retries and kopf's other messages keep their level.

kopf also logs every admission *denial* at ERROR (``Webhook 'gpu-memory' failed permanently: <message>``:
``kopf.AdmissionError`` is a ``PermanentError``), so a user's refused pod read as an operator failure.
:class:`DemoteAdmissionDenial` lowers those to DEBUG; the validating handler logs its own INFO line for each refusal
(the decision, with the pod's name). A webhook handler that fails with an exception is logged by kopf with another
message and its traceback, at ERROR, untouched.
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


class DemoteAdmissionDenial(logging.Filter):
    """Lowers kopf's ``Webhook '<id>' failed permanently: <message>`` records (a denial, not a failure) to DEBUG.

    kelvin's webhook handlers raise a ``PermanentError`` only as ``kopf.AdmissionError``, for a pod validation
    refuses; the handler has logged the decision at INFO already."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if record.levelno != logging.ERROR or not (msg.startswith(WEBHOOK_PREFIX) and DENIAL_INFIX in msg):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


#: How kopf words a webhook handler that raised a ``PermanentError`` (``f"{handler} failed permanently: {e}"``).
WEBHOOK_PREFIX = "Webhook '"
DENIAL_INFIX = " failed permanently: "


def demote_kopf_success() -> None:
    """Install :class:`DemoteHandlerSuccess` and :class:`DemoteAdmissionDenial` on kopf's objects logger (once each,
    however often it is called)."""
    logger = logging.getLogger(KOPF_OBJECTS_LOGGER)
    for kind in (DemoteHandlerSuccess, DemoteAdmissionDenial):
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
