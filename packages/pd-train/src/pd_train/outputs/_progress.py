"""Progress of the step loop: a tqdm bar on a terminal, plain lines otherwise (SLURM logs)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from tqdm import tqdm

DEFAULT_KEYS = (
    "loss/total",
    "loss/faithfulness",
    "loss/stochastic_recon",
    "loss/chunkwise_subset_recon",
    "loss/subset_recon",
    "loss/importance_minimality",
    "perf/mfu",
)
# Short labels keep the bar on one line; unknown keys are shown without their "group/" prefix.
SHORT_LABELS = {
    "loss/total": "total",
    "loss/faithfulness": "faith",
    "loss/stochastic_recon": "stoch_recon",
    "loss/chunkwise_subset_recon": "chunk_recon",
    "loss/subset_recon": "subset_recon",
    "loss/importance_minimality": "imp_min",
    "perf/mfu": "mfu",
}


def short_label(key: str) -> str:
    return SHORT_LABELS.get(key, key.rsplit("/", 1)[-1])


def format_value(value: Any) -> str:
    """Compact: 3 significant digits, exponent only where needed (``0.031``, ``4.5e-05``)."""
    try:
        return f"{float(value):.3g}"
    except (TypeError, ValueError):
        return str(value)


def format_metrics(metrics: Mapping[str, Any], keys: Sequence[str]) -> str:
    """``"total=0.123 faith=4.5e-05 recon=0.031"``: the ``keys`` present in ``metrics``."""
    return " ".join(f"{short_label(k)}={format_value(metrics[k])}" for k in keys if k in metrics)


def format_duration(seconds: float) -> str:
    """``"42s"``, ``"3m05s"``, ``"2h07m"``."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """Shows step, it/s, ETA and the main losses of the step loop.

    On a terminal (and on the primary process) a tqdm bar on ``stream``; otherwise, on the
    primary process, one plain line every ``log_every`` steps and at the last step, e.g.
    ``step 120/1000 (12%) | 3.41 it/s | ETA 4m18s | total=0.123 faith=4.5e-05``; other processes
    show nothing. Steps are 0-based: ``update(step)`` means step ``step`` has finished.

    ``update`` reads values from ``metrics`` only when it is given, so passing device arrays only
    on logging steps keeps the loop free of per-step host syncs. The rate and ETA, in plain
    lines and on the bar, are measured from the first update on, so the first step's compile
    time does not skew them: the bar appears at the first update, already at that step (a
    resumed run's bar starts at its resumed step), and times only the steps after it.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        start_step: int = 0,
        keys: Sequence[str] = DEFAULT_KEYS,
        is_primary: bool = True,
        log_every: int = 100,
        stream: IO[str] | None = None,
        bar: bool | None = None,
        terminal: Any = None,
    ) -> None:
        """``bar``: force the tqdm bar on or off (default: on when ``stream`` is a terminal).
        ``terminal``: a :class:`pd_train.outputs.Terminal` that owns the screen: the bar is its
        status line (when it has one; else plain lines through it), and the ETA says it is
        provisional while it lists a background compile."""
        if total_steps < 0:
            msg = f"total_steps must be >= 0, got {total_steps}"
            raise ValueError(msg)
        if not 0 <= start_step <= total_steps:
            msg = f"start_step must be in [0, total_steps={total_steps}], got {start_step}"
            raise ValueError(msg)
        if log_every < 1:
            msg = f"log_every must be >= 1, got {log_every}"
            raise ValueError(msg)
        self.total_steps = total_steps
        self.start_step = start_step
        self.keys = tuple(keys)
        self.is_primary = is_primary
        self.log_every = log_every
        self.stream = sys.stderr if stream is None else stream
        self.terminal = terminal
        if terminal is not None:
            bar = False  # the terminal draws it (see _show)
        if bar is None:
            isatty = getattr(self.stream, "isatty", None)
            bar = bool(isatty and isatty())
        self.done = start_step  # steps finished
        self._text = ""
        self._first: tuple[int, float] | None = None  # (done, time) at the first update
        self._updated_at = time.perf_counter()  # the time of the last update
        self._last_line_at = start_step
        self._closed = False
        self._use_bar = is_primary and bar
        self._bar: tqdm[Any] | None = None

    def _open_bar(self, done: int) -> None:
        self._bar = tqdm(
            total=self.total_steps,
            initial=done,
            file=self.stream,
            unit="step",
            dynamic_ncols=True,
            smoothing=0.1,
        )

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        if self._closed or not self.is_primary:
            return
        now = time.perf_counter()
        done = step + 1
        self._updated_at = now
        if self._first is None:
            self._first = (done, now)
        if metrics is not None:
            self._text = format_metrics(metrics, self.keys)
        if self._use_bar and self._bar is None:
            self._open_bar(done)  # the steps so far, with the first one's compile, are not timed
            assert self._bar is not None
            if metrics is not None:
                self._bar.set_postfix_str(self._text)
            self.done = done
            return
        if self._bar is not None:
            self._bar.update(done - self.done)
            if metrics is not None:
                self._bar.set_postfix_str(self._text, refresh=False)
            self.done = done
            return
        self.done = done
        if self.terminal is not None and self.terminal.bar and self.is_primary:
            self._show(now)
            return
        if (done - self.start_step) % self.log_every == 0 or done == self.total_steps:
            self._write_line(now)

    def _show(self, now: float) -> None:
        """The bar on the terminal's status line, redrawn at most 10 times a second."""
        if self.done != self.total_steps and now - getattr(self, "_shown", 0.0) < 0.1:
            return
        self._shown = now
        total = self.total_steps
        frac = self.done / total if total else 1.0
        width = 20
        filled = int(frac * width)
        bar = "#" * filled + "-" * (width - filled)
        self.terminal.status("progress", f"[{bar}] " + self.line(now))

    def close(self) -> None:
        """Closes the bar; in plain mode writes a last line if the last step was not shown."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self.terminal is not None and self.terminal.bar:
            if self.is_primary:
                self.terminal.status("progress", None)
                # The last state stays as a line, its rate that of the steps (not of what ran
                # after the last of them: a checkpoint, the eval).
                self.terminal.line(self.line(self._updated_at))
        elif self.is_primary and self.done != self._last_line_at:
            self._write_line(self._updated_at)

    def line(self, now: float | None = None) -> str:
        """The plain progress line for the current state."""
        now = time.perf_counter() if now is None else now
        total = self.total_steps
        pct = f" ({100 * self.done // total}%)" if total else ""
        parts = [f"step {self.done}/{total}{pct}"]
        rate = self._rate(now)
        if rate is not None:
            parts.append(f"{rate:.3g} it/s")
            eta = format_duration((total - self.done) / rate)
            background = list(self.terminal.background) if self.terminal is not None else []
            if background and self.done < total:
                # A compile in another thread takes a core: the rate measured now is not the
                # rate once it is done.
                eta += f" (provisional: compiling {', '.join(background)} in the background)"
            parts.append(f"ETA {eta}")
        if self._text:
            parts.append(self._text)
        return " | ".join(parts)

    def _rate(self, now: float) -> float | None:
        if self._first is None:
            return None
        steps = self.done - self._first[0]
        elapsed = now - self._first[1]
        if steps <= 0 or elapsed <= 0:
            return None
        return steps / elapsed

    def _write_line(self, now: float) -> None:
        self._last_line_at = self.done
        if self.terminal is not None:
            self.terminal.line(self.line(now))
            return
        self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
