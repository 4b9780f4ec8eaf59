"""Stop signals: SIGTERM and Ctrl-C stop a run at the next step boundary, after saving; a second
Ctrl-C aborts at once."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from pd_train.run.distributed import Placement

log = logging.getLogger("pd_train")


#: Exit code of ``pd-train run`` stopped by Ctrl-C (SIGINT), after its checkpoint and summary
#: were written (its plots are skipped: the prompt comes back at once) (128 + SIGINT, the shell's convention). A SIGTERM stop exits 0: SLURM
#: requeues the job and the next attempt resumes.
EXIT_INTERRUPTED = 130


class StopSignals:
    """SIGTERM or Ctrl-C (SIGINT): finish the current step, save, write the summary (and after
    SIGTERM the plots), and return (``stop_signal`` names the signal). A second Ctrl-C aborts at once: one line on
    stderr and exit 130, nothing more saved (the last checkpoint stays).

    The second Ctrl-C is seen by a watcher thread through ``signal.set_wakeup_fd`` (written by
    the C-level handler), so it acts even while the main thread is inside a long XLA compile,
    where Python signal handlers cannot run.
    """

    def __init__(self) -> None:
        self.stop_signal: str | None = None
        self.last_saved: int | None = None
        self._previous: dict[int, Any] = {}
        self._sockets: tuple[Any, Any] | None = None
        self._previous_wakeup = -1
        #: The run's :class:`pd_train.outputs.Terminal` (None: stderr), where the abort line
        #: goes.
        self.terminal: Any = None

    def saved(self, step: int) -> None:
        """Note the last checkpoint written (named by a second Ctrl-C's abort)."""
        self.last_saved = step

    @property
    def requested(self) -> bool:
        return self.stop_signal is not None

    def _handler(self, signum: int, _frame: Any) -> None:
        if self.stop_signal is None:
            self.stop_signal = signal.Signals(signum).name
            again = (
                " (Ctrl-C again aborts at once, without saving)" if signum == signal.SIGINT else ""
            )
            # Logged from a thread: a handler runs between two bytecodes of the main thread,
            # maybe inside the terminal's write of another line, which must finish first.
            import threading

            message = f"{self.stop_signal}: saving at the next step boundary, then exiting{again}"
            threading.Thread(target=log.warning, args=(message,), daemon=True).start()

    def _abort(self) -> None:
        saved = (
            f"the last checkpoint is step {self.last_saved}"
            if self.last_saved is not None
            else "no checkpoint was saved by this attempt"
        )
        text = f"pd-train: aborted by a second Ctrl-C; {saved}\n"
        fd = getattr(self.terminal, "fd", -1)
        clear = "\r\x1b[K" if getattr(self.terminal, "bar", False) else ""  # the status line
        # fd 2 may be the terminal's capture pipe, whose reader would not run before the exit.
        os.write(fd if fd >= 0 else 2, (clear + text).encode())
        os._exit(EXIT_INTERRUPTED)

    def _watch(self, reader: Any) -> None:
        interrupts = 0
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                data = b""
            if not data:
                reader.close()
                return
            interrupts += data.count(int(signal.SIGINT))
            if interrupts >= 2:
                self._abort()

    def __enter__(self) -> StopSignals:
        import socket
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be installed in the main thread
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        self._sockets = (reader, writer)
        self._previous_wakeup = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handler)
        threading.Thread(target=self._watch, args=(reader,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sockets is None:
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(self._previous_wakeup)
        self._sockets[1].close()  # the watcher reads end-of-file, closes its end and ends
        self._sockets = None


def agreed(flag: bool, placement: Placement) -> bool:
    """True when any process has the flag: every process must leave the loop at the same step,
    or the others would wait in the next step's collectives forever."""
    if placement.num_processes == 1:
        return flag
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))
