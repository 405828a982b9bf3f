"""A job's console lines, also in its Hydra log file.

varbench reports with plain prints (result lines, stage summaries, one-line errors), which Hydra's
logging leaves out of the job's log file (``<output dir>/<job name>.log``): without this, that file
was empty for a job that went well, and under submitit the lines were only in ``.submitit/``.
:func:`tee_stdout` copies standard output there for the job's extent. Progress bars go to standard
error and stay out of the file.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator, Optional, TextIO


class _Tee:
    """A text stream writing to the console and, line by line, to a file."""

    def __init__(self, console: TextIO, file: TextIO):
        self._console, self._file = console, file

    def write(self, text: str) -> int:
        self._console.write(text)
        self._file.write(text)
        self._file.flush()  # a killed job keeps every line it printed
        return len(text)

    def flush(self) -> None:
        self._console.flush()
        self._file.flush()

    def __getattr__(self, name):  # isatty, encoding, fileno, ... of the console
        return getattr(self._console, name)


def hydra_log_file() -> Optional[Path]:
    """The file of the job's Hydra logging config (its FileHandler), or None when there is none."""
    from hydra.core.hydra_config import HydraConfig

    handlers = HydraConfig.get().job_logging.get("handlers") or {}
    for handler in handlers.values():
        if str(handler.get("class", "")).endswith("FileHandler") and handler.get("filename"):
            return Path(str(handler.get("filename")))
    return None


@contextlib.contextmanager
def tee_stdout(path: Optional[Path]) -> Iterator[None]:
    """Inside the block, standard output also goes to ``path`` (appended); no-op for None."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as file:
        console = sys.stdout
        sys.stdout = _Tee(console, file)
        try:
            yield
        finally:
            sys.stdout = console
