"""Log formatters named in settings.LOGGING (JSON lines come from python-json-logger)."""

from __future__ import annotations

import logging

# What every LogRecord has; anything else on a record came in through `extra`.
_STANDARD = frozenset(
    [*vars(logging.LogRecord("", 0, "", 0, "", None, None)), "message", "asctime", "taskName"]
)


class PlainFormatter(logging.Formatter):
    """`time level logger: message`, then ` key=value` for each field an abp.* record carries.

    Job events (`abp.jobs`) keep their fields as record attributes, which JSON logs put
    at the top level of the line; in text they follow the message. Other loggers'
    `extra` (Celery's, for one) is left out, as logging's own formatter does.
    """

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if not record.name.startswith("abp."):
            return text
        fields = [f"{key}={value}" for key, value in vars(record).items() if key not in _STANDARD]
        return " ".join([text, *fields]) if fields else text
