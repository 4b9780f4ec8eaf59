"""The one writer of a run's terminal: every line a run shows goes through a :class:`Terminal`.

Compile announcements (from the recorder's thread-local callbacks: the main thread's and the
background step and eval compiles), the progress bar or progress lines, eval tables, pd's log
lines, whatever other code writes to file descriptor 2 (XLA's C++ log, W&B's banners, the plot
workers' stderr) are handed to one object that writes whole lines under one lock. On a terminal
with a size the progress bar and the compiles in flight share one status line at the bottom,
cleared before each line and redrawn after it; without a size (a pty with no window size, a
file, a SLURM log) everything is a plain line. XLA's "Very slow compile? ... file a bug" alarm
is replaced by one line of pd's naming the compiles in flight.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

#: Per thread: the name a jit is announced (and recorded in the program records) by, when the
#: function's own name does not tell it apart (pd-init's ``stacked`` makes both the params and
#: the persistent-PGD sources): see :func:`compile_label`.
_labels = threading.local()
#: The line :meth:`Terminal.capture_stderr` writes behind the captured output when it ends.
_END_OF_CAPTURE = b"\x00pd-terminal: end of capture\x00"


@contextlib.contextmanager
def compile_label(name: str) -> Iterator[None]:
    """Within (this thread): compiles are announced as ``<phase>: <name>``."""
    previous = getattr(_labels, "name", None)
    _labels.name = name
    try:
        yield
    finally:
        _labels.name = previous


def labelled(on_compile: Callable[[str, dict[str, Any]], None] | None) -> Any:
    """An ``on_compile`` callback that renames the jit to this thread's :func:`compile_label`
    (when one is set) before passing the event on."""
    if on_compile is None:
        return None

    def callback(event: str, info: dict[str, Any]) -> None:
        name = getattr(_labels, "name", None)
        if name is not None and info.get("name") != name:
            info = {**info, "jit": name}
        on_compile(event, info)

    return callback


def terminal_columns(fd: int) -> int:
    """The window width of the terminal on ``fd``; 0 when ``fd`` is no terminal or has no size
    (a pty opened without a window size reports 0 columns)."""
    try:
        if not os.isatty(fd):
            return 0
        return os.get_terminal_size(fd).columns
    except OSError:
        return 0


class Terminal:
    """Whole lines, one lock, one status line (bar mode) or none (plain mode).

    ``stream``: where to write (default: a duplicate of file descriptor 2 taken now, so that
    :meth:`capture_stderr` can route fd 2 through this writer without looping; ``sys.stderr``
    itself when it is not fd 2, e.g. replaced by a caller capturing it). ``bar``: force the
    status line on or off (default: on when the stream is a terminal with a window size).
    ``capture``: whether :meth:`capture_stderr` redirects fd 2 (default: when this terminal
    took its own duplicate of fd 2).
    """

    def __init__(
        self, stream: IO[str] | None = None, *, bar: bool | None = None, capture: bool | None = None
    ) -> None:
        import sys

        self._owned = False
        if stream is None:
            try:
                on_fd2 = sys.stderr.fileno() == 2
            except (AttributeError, OSError, ValueError):
                on_fd2 = False
            if on_fd2:
                stream = open(os.dup(2), "w", encoding="utf-8", errors="replace", closefd=True)  # noqa: SIM115
                self._owned = True
            else:
                stream = sys.stderr
        self._capture = self._owned if capture is None else capture
        self.stream = stream
        fileno = getattr(stream, "fileno", None)
        try:
            self._fd = fileno() if fileno is not None else -1
        except (OSError, ValueError):  # StringIO
            self._fd = -1
        self.bar = (terminal_columns(self._fd) > 0) if bar is None else bar
        self._lock = threading.RLock()
        self._status: dict[str, str] = {}  # key -> text, in insertion order
        self._drawn = False
        #: Compiles in flight (``{label: start time}``), and those of them in another thread.
        self.compiling: dict[str, float] = {}
        self.background: dict[str, float] = {}
        self._closed = False

    @property
    def fd(self) -> int:
        """The file descriptor written to (-1: none)."""
        return self._fd

    # -- lines
    def columns(self) -> int:
        return terminal_columns(self._fd) or 80

    def line(self, text: str) -> None:
        """Write ``text`` (one or more lines) as whole lines, above the status line."""
        with self._lock:
            if self._closed:
                return
            self._clear()
            for part in text.rstrip("\n").split("\n"):
                self._write(part + "\n")
            self._draw()
            self._flush()

    def status(self, key: str, text: str | None) -> None:
        """Set (``text``) or remove (None) a part of the status line; plain mode keeps none."""
        if not self.bar:
            return
        with self._lock:
            if text is None:
                self._status.pop(key, None)
            else:
                self._status[key] = text
            if self._closed:
                return
            self._clear()
            self._draw()
            self._flush()

    def _clear(self) -> None:
        if self._drawn:
            self._write("\r\x1b[K")
            self._drawn = False

    def _draw(self) -> None:
        if not self.bar or not self._status:
            return
        text = " | ".join(self._status.values())
        width = max(self.columns() - 1, 10)
        if len(text) > width:
            text = text[: width - 1] + "…"
        self._write(text)
        self._drawn = True

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(text)

    def _flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()

    def close(self) -> None:
        """Clear the status line (what it showed was written as lines already) and stop."""
        with self._lock:
            if self._closed:
                return
            self._clear()
            self._flush()
            self._closed = True
            if self._owned:
                with contextlib.suppress(OSError):
                    self.stream.close()

    # -- adapters for code that writes to a stream or logs
    def writer(self) -> _LineStream:
        """A text stream whose complete lines go to :meth:`line` (for code that takes a
        ``stream``)."""
        return _LineStream(self)

    def compile_announcer(self) -> CompileLines:
        return CompileLines(self)

    @contextlib.contextmanager
    def logging_to_terminal(self, logger: str = "pd_train") -> Iterator[None]:
        """Within: ``logger``'s stream handlers are replaced by one writing through here."""
        target = logging.getLogger(logger)
        replaced = [
            h
            for h in target.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
        ]
        handler = _TerminalHandler(self)
        if replaced:
            handler.setFormatter(replaced[0].formatter)
            handler.setLevel(replaced[0].level)
        for h in replaced:
            target.removeHandler(h)
        target.addHandler(handler)
        try:
            yield
        finally:
            target.removeHandler(handler)
            for h in replaced:
                target.addHandler(h)

    @contextlib.contextmanager
    def capture_stderr(self) -> Iterator[None]:
        """Within: what is written to file descriptor 2 (XLA's C++ log, other libraries, child
        processes that inherit it) reaches the terminal as whole lines through :meth:`line`;
        XLA's slow-compile alarm becomes one line of pd's. Needs the default ``stream`` (a
        duplicate of fd 2 taken before)."""
        from pd_train.outputs._alarm import AlarmFilter

        if not self._capture:
            yield
            return
        read_end, write_end = os.pipe()
        saved = os.dup(2)
        marker = os.dup(write_end)  # ends the capture: see the finally clause
        drained = threading.Event()

        def write(raw: bytes) -> None:
            if self._closed:  # a child process writing after the run: to stderr as written
                with contextlib.suppress(OSError):
                    os.write(2, raw)
                return
            self.line(raw.decode(errors="replace"))

        def forward() -> None:
            alarm = AlarmFilter(write, self._alarm_line)
            with os.fdopen(read_end, "rb", buffering=0) as pipe:
                pending = b""
                while chunk := pipe.read(65536):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for raw in lines:
                        if raw.endswith(_END_OF_CAPTURE):  # behind a child's partial line?
                            if raw != _END_OF_CAPTURE:
                                alarm.line(raw.removesuffix(_END_OF_CAPTURE) + b"\n")
                            alarm.flush()
                            drained.set()
                            continue
                        alarm.line(raw + b"\n")
                if pending:
                    alarm.line(pending)
            alarm.flush()
            drained.set()

        import sys

        reader = threading.Thread(target=forward, name="pd-terminal-stderr", daemon=True)
        reader.start()
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(write_end, 2)
        os.close(write_end)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            # Everything this process wrote is in the pipe now; a marker behind it tells when
            # the reader has forwarded it. Child processes that inherited the pipe (W&B's
            # service, a plot worker) may keep it open: the reader goes on forwarding what they
            # write, to stderr once the terminal is closed, instead of waiting for them.
            with contextlib.suppress(OSError):
                os.write(marker, _END_OF_CAPTURE + b"\n")
            os.close(marker)
            drained.wait(timeout=5)

    def _alarm_line(self) -> str:
        names = ", ".join(self._compiling()) or "a jit"
        return (
            f"pd: {names} still compiling (more than 2 min; a cold compile of a large config "
            "takes minutes, the persistent compile cache makes the next one fast)\n"
        )

    def _compiling(self) -> list[str]:
        with self._lock:
            return list(self.compiling)


class _LineStream:
    """A write-only text stream that hands complete lines to a :class:`Terminal`."""

    def __init__(self, terminal: Terminal) -> None:
        self.terminal = terminal
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self.terminal.line(line)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


class _TerminalHandler(logging.Handler):
    def __init__(self, terminal: Terminal) -> None:
        super().__init__()
        self.terminal = terminal

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.terminal.line(self.format(record))
        except Exception:
            self.handleError(record)


class CompileLines:
    """An ``on_compile`` callback for :class:`pd_probe.Recorder` writing whole lines through a
    :class:`Terminal`: each compile's time on the line that names it.

    A compile in the main thread shows ``compiling <jit> (cache miss)…`` on the status line
    while it runs (plain mode: as a line, unless a cache hit) and ends with ``compiled <jit> in 12.3 s (cache
    miss)``; one in another thread is announced when it starts (unless a cache hit), ``compiling eval_metrics in the
    background (cache miss)…``, ends with ``compiled eval_metrics in the background in 25.7 s
    (cache miss)``, and is listed in :attr:`Terminal.background` meanwhile (the progress ETA
    says it is provisional)."""

    def __init__(self, terminal: Terminal) -> None:
        self.terminal = terminal
        self._open: dict[int, tuple[str, float, bool]] = {}  # thread -> (label, t0, announced)

    @staticmethod
    def _label(info: Mapping[str, Any]) -> str:
        name, jit = str(info.get("name")), str(info.get("jit"))
        return name if jit in (name, "?") else f"{name}: {jit}"

    @staticmethod
    def _cache(cache: str) -> str:
        return {"off": "no cache", "none": "no cache"}.get(cache, f"cache {cache}")

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        thread = threading.get_ident()
        background = threading.current_thread() is not threading.main_thread()
        label = self._label(info)
        if event == "start":
            self._open[thread] = (label, time.perf_counter(), False)
            if background:  # it takes a core from now on: the ETA says so at once
                with self.terminal._lock:
                    self.terminal.background[label] = time.perf_counter()
            if not info.get("cache_enabled", True):
                self._begin(thread, label, "none", background)
            return
        if event == "cache":
            entry = self._open.get(thread)
            if entry is not None and not entry[2]:
                self._begin(thread, label, str(info.get("cache")), background)
            return
        if event == "done":
            entry = self._open.pop(thread, None)
            self.terminal.status(f"compile:{thread}", None)
            where = " in the background" if background else ""
            with self.terminal._lock:
                self.terminal.background.pop(label, None)
                self.terminal.compiling.pop(label, None)
            cache = self._cache(str(info.get("cache")))
            self.terminal.line(f"compiled {label}{where} in {info['seconds']:.1f} s ({cache})")
            del entry

    def _begin(self, thread: int, label: str, cache: str, background: bool) -> None:
        _, t0, _ = self._open.get(thread, (label, time.perf_counter(), False))
        self._open[thread] = (label, t0, True)
        text = self._cache(cache)
        # A cache hit takes a second at most: its ``compiled ... (cache hit)`` line is enough.
        say = cache != "hit"
        with self.terminal._lock:
            self.terminal.compiling[label] = t0
        if background:
            with self.terminal._lock:
                self.terminal.background[label] = t0
            if say:
                self.terminal.line(f"compiling {label} in the background ({text})…")
        elif self.terminal.bar:
            self.terminal.status(f"compile:{thread}", f"compiling {label} ({text})…")
        elif say:
            self.terminal.line(f"compiling {label} ({text})…")


def format_eval_table(step: int, record: Mapping[str, Any]) -> str:
    """The eval's cross-entropy and KL per mask as a short table, and its total L0::

    eval after step 99 (total L0 709.3)
      mask          CE      KL
      clean      2.737       -
      ci         3.375  0.6464
    """
    import numpy as np

    def value(key: str) -> float | None:
        if key not in record:
            return None
        try:
            return float(np.asarray(record[key]))
        except (TypeError, ValueError):
            return None

    masks: list[str] = []
    for key in record:
        for prefix in ("eval/ce_", "eval/kl_"):
            if key.startswith(prefix):
                mask = key.removeprefix(prefix)
                if mask not in masks:
                    masks.append(mask)
    masks.sort(key=lambda m: (m != "clean", m))
    l0 = value("l0_group/total")
    head = f"eval after step {step}" + (f" (total L0 {l0:.4g})" if l0 is not None else "")
    if not masks:
        return head
    rows = [("mask", "CE", "KL")]
    for mask in masks:
        ce, kl = value(f"eval/ce_{mask}"), value(f"eval/kl_{mask}")
        rows.append((mask, "-" if ce is None else f"{ce:.4g}", "-" if kl is None else f"{kl:.4g}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [head]
    for r in rows:
        lines.append(f"  {r[0].ljust(widths[0])}  {r[1].rjust(widths[1])}  {r[2].rjust(widths[2])}")
    return "\n".join(lines)
