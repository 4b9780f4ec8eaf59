"""Every command shown in the READMEs and docs is checked against the code (issue 16, item 6).

The fenced code blocks of README.md, packages/*/README.md and docs/*.md are parsed; each line
that starts a ``pd-train`` or ``pd-launch`` command (continuation lines joined, ``$ `` prompts
and ``# comments`` dropped) is a documented command. Every one must name an existing subcommand
and only options that subcommand's parser has (synopsis lines with ``[--flag …]`` included).
Those that run on a CPU in seconds are run, in a scratch directory that sees the repository's
``configs/``: they must exit as the doc implies (0, or 2 where the doc shows an error), and the
first lines of output the doc shows must appear in what they print. The rest are listed in
SKIPPED with the reason.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted(ROOT.glob("packages/*/README.md")),
    *sorted(ROOT.glob("docs/*.md")),
]
PROGRAMS = ("pd-train", "pd-launch")

#: Documented commands not run here (matched by prefix), and why. Their options are still
#: checked against the parser.
SKIPPED = {
    # A decomposition, minutes on a CPU: `pd-train run` is exercised end to end by
    # tests/pd_train/test_run.py and tests/integration/test_default_run.py.
    "pd-train run": "a whole decomposition (minutes); see test_run.py, test_default_run.py",
    # The documented compiles are of the 8B and SmolLM2 configs (minutes, GiBs); test_compile.py
    # runs the same command on a tiny config.
    "pd-train compile": "compiles a production-size config (minutes)",
    # Tokenizes the user's text files with SmolLM2's tokenizer (the smollm2 extra); the GGUF
    # tests run it on their own files.
    "pd-train tokenize": "needs the user's text files and the smollm2 extra",
    # Real probes compile the 8B config per arm (hours) or need SLURM and GPUs.
    "pd-train probe configs/llama8b-full32L.yaml": "compiles the 8B config per arm (hours)",
    # Needs a job.toml that the README shows only in prose; pd-launch's tests render it.
    "pd-launch submit --dry-run --job job.toml": "needs the README's job.toml on disk",
    # Read a finished run's checkpoints: a decomposition first (minutes); the analysis tests
    # run them on a run they make.
    "pd-train analyze": "needs a finished run (minutes)",
    "pd-train report": "needs a finished run (minutes)",
    # Six toy decompositions one after another (minutes); test_sweep.py runs a toy sweep.
    "pd-train sweep builtin:tms_5_2_fast": "six toy decompositions (minutes); see test_sweep.py",
    # A real submission: the user's weights, tokens and SLURM (the dry run above it is run).
    "pd-train submit configs/llama8b-full32L.yaml --set": "needs Llama-3-8B, tokens and SLURM",
    # Need a job id of a running SLURM cluster.
    "pd-launch status": "needs SLURM",
    "pd-launch wait": "needs SLURM",
    "pd-launch cancel": "needs SLURM",
}


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str  # the command as one line
    output: tuple[str, ...]  # the lines the doc shows after a `$ ` command, if any
    synopsis: bool  # a usage line ([--flag …], PLACEHOLDERS): checked, not run

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _blocks(path: Path) -> list[tuple[int, str, list[str]]]:
    """(first line number, fence language, lines) of every fenced code block."""
    out, current, start, lang = [], None, 0, ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if current is None:
                current, start, lang = [], number + 1, line[3:].strip()
            else:
                out.append((start, lang, current))
                current = None
        elif current is not None:
            current.append(line)
    return out


def documented_commands() -> list[Command]:
    commands = []
    for path in DOCS:
        doc = str(path.relative_to(ROOT))
        for start, lang, lines in _blocks(path):
            if lang not in ("", "bash", "sh", "console"):
                continue
            i = 0
            while i < len(lines):
                raw = lines[i]
                prompt = raw.startswith("$ ")
                text = raw[2:] if prompt else raw
                if not text.split() or text.split()[0] not in PROGRAMS:
                    i += 1
                    continue
                number = start + i
                while text.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
                output: list[str] = []
                if prompt:
                    while i < len(lines) and not lines[i].startswith("$ "):
                        output.append(lines[i])
                        i += 1
                code = text.split(" #")[0]
                placeholder = any(re.fullmatch(r"[A-Z][A-Z0-9_]{2,}", t) for t in code.split())
                synopsis = placeholder or "[--" in code or "…" in code
                commands.append(Command(doc, number, text, tuple(output), synopsis))
    return commands


COMMANDS = documented_commands()


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from pd_launch import _cli as launch_cli
    from pd_train.cli import build_parser

    return {"pd-train": build_parser(), "pd-launch": launch_cli._parser()}


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def test_the_docs_show_commands() -> None:
    """The parser above finds the documented commands (a guard against parsing nothing)."""
    texts = [c.text for c in COMMANDS]
    assert any(t.startswith("pd-train run") for t in texts)
    assert any(t.startswith("pd-train probe") for t in texts)
    assert any(t.startswith("pd-launch submit") for t in texts)
    assert len(COMMANDS) >= 15, texts


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_documented_command_names_existing_options(command: Command) -> None:
    program, sub, *_ = command.text.split()
    parser = _parsers()[program]
    subparser = _subparser(parser, sub)
    assert subparser is not None, f"{command.id}: `{program} {sub}` is no subcommand"
    known = {s for a in subparser._actions for s in a.option_strings} | {"--"}
    body = command.text.split(" -- ")[0]  # pd-launch: what follows `--` is the job's command
    body = re.sub(r"(^|\s)#.*$", "", body)  # a trailing comment
    flags = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", body)
    unknown = [f for f in flags if f not in known]
    assert not unknown, f"{command.id}: {program} {sub} has no option {unknown}"


def _skip_reason(command: Command) -> str | None:
    if command.synopsis:
        return "a usage synopsis"
    for prefix, reason in SKIPPED.items():
        if command.text.startswith(prefix):
            return reason
    return None


RUNNABLE = [c for c in COMMANDS if _skip_reason(c) is None]


def test_some_documented_commands_run() -> None:
    assert len(RUNNABLE) >= 3, [c.text for c in RUNNABLE]


def _normalize(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("command", RUNNABLE, ids=[c.id for c in RUNNABLE])
def test_documented_command_runs_as_shown(command: Command, tmp_path: Path) -> None:
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    argv = shlex.split(command.text, comments=True)
    program = {"pd-train": "pd_train.cli", "pd-launch": "pd_launch._cli"}[argv[0]]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "-m", program, *argv[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    shown = [line for line in command.output if line.strip()]
    error_shown = bool(shown) and ": error:" in shown[0]
    out = proc.stdout + proc.stderr
    assert proc.returncode == (2 if error_shown else 0), f"{command.id}: {out[-3000:]}"
    # The doc's first output lines (before any path that depends on where it ran).
    head = []
    for line in shown:
        if "/tmp/" in line or "--output=" in line or "--chdir=" in line:
            break
        head.append(line)
    assert _normalize("\n".join(head[:6])) in _normalize(out), f"{command.id}: {out[-3000:]}"
    # Nothing written next to the configs: a documented dry run or error writes nothing.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configs"], list(tmp_path.iterdir())
