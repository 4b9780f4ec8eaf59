"""XLA's slow-compile alarm, replaced by one line of pd's: a cold compile of a large config takes
minutes, and that is no bug to file. Used by ``pd-train compile`` and by a run's terminal."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

__all__ = ["AlarmFilter", "xla_slow_compile_alarm_replaced"]

_ALARM_TEXT = "Very slow compile?"
_ALARM_SOURCE = "slow_operation_alarm"


def _is_separator(line: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= 8 and set(stripped) == {"*"}


class AlarmFilter:
    """Passes stderr's lines through, but for XLA's slow-compile alarm: its block (a log line
    from slow_operation_alarm, a row of asterisks, "[...] Very slow compile? If you want to file
    a bug ...", asterisks) becomes ``replacement`` (or what it returns, called then). Lines that may start a block wait until the
    next line tells whether they do."""

    def __init__(
        self, write: Callable[[bytes], None], replacement: str | Callable[[], str]
    ) -> None:
        self._write = write
        self._replacement = replacement
        self._held: list[bytes] = []
        self._in_alarm = False

    def line(self, raw: bytes) -> None:
        text = raw.decode(errors="replace")
        if _is_separator(text) or (_ALARM_SOURCE in text and _ALARM_TEXT not in text):
            if self._in_alarm and _is_separator(text):
                self._in_alarm = False  # the block's closing row
                return
            self._held.append(raw)
            return
        if _ALARM_TEXT in text:
            self._held.clear()
            self._in_alarm = True
            text = self._replacement if isinstance(self._replacement, str) else self._replacement()
            self._write(text.encode())
            return
        self._in_alarm = False
        self.flush()
        self._write(raw)

    def flush(self) -> None:
        for raw in self._held:
            self._write(raw)
        self._held.clear()


@contextlib.contextmanager
def xla_slow_compile_alarm_replaced(name: str) -> Iterator[None]:
    """Within: XLA's "Very slow compile? If you want to file a bug ..." alarm (XLA logs it to
    file descriptor 2 after two minutes of one compile, then at doubling intervals) is replaced
    by one line of pd's own naming the jit; everything else written to stderr goes through as
    written. A cold compile of a large config takes minutes: that is no bug to file."""
    replacement = (
        f"pd: {name} is still compiling (more than 2 min; a cold compile of a large config "
        "takes minutes, the persistent compile cache makes the next one fast)\n"
    )
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to filter
        yield
        return
    read_end, write_end = os.pipe()

    def write(data: bytes) -> None:
        with contextlib.suppress(OSError):
            os.write(saved, data)

    def forward() -> None:
        alarm = AlarmFilter(write, replacement)
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            pending = b""
            while chunk := pipe.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    alarm.line(line + b"\n")
            if pending:
                alarm.line(pending)
        alarm.flush()

    reader = threading.Thread(target=forward, name="pd-stderr-filter", daemon=True)
    reader.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        os.dup2(saved, 2)  # the pipe's last writer closes: the reader drains and ends
        reader.join(timeout=5)
        os.close(saved)
