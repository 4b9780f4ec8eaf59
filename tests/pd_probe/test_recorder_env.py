"""A compile record's environment block is an allow-list of what explains a compile, not a copy
of the caller's shell (issue 31, item 9)."""

from __future__ import annotations

from pd_probe._recorder import compile_environment

SHELL = {
    "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
    "JAX_PLATFORMS": "cpu",
    "JAX_COMPILATION_CACHE_DIR": "/cache",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "NCCL_DEBUG": "INFO",
    "TF_CPP_MIN_LOG_LEVEL": "1",
    "NVIDIA_TF32_OVERRIDE": "0",
    "PD_PROBE_ARM": "base",
    # The rest of a researcher's shell.
    "HOME": "/home/me",
    "PATH": "/usr/bin",
    "WANDB_API_KEY": "k",
    "HF_TOKEN": "t",
    "TF_TOKEN_app_terraform_io": "terraform",
    "TF_VAR_db_password": "hunter2",
    "SSH_AUTH_SOCK": "/tmp/agent",
    "JAX_SECRET_TEST": "s",
}


def test_only_what_explains_a_compile_is_kept() -> None:
    assert compile_environment(SHELL) == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "JAX_COMPILATION_CACHE_DIR": "/cache",
        "JAX_PLATFORMS": "cpu",
        "NCCL_DEBUG": "INFO",
        "NVIDIA_TF32_OVERRIDE": "0",
        "PD_PROBE_ARM": "base",
        "TF_CPP_MIN_LOG_LEVEL": "1",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
    }


def test_the_block_reads_the_process_environment_by_default(monkeypatch) -> None:
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    monkeypatch.setenv("TF_VAR_region", "eu")
    env = compile_environment()
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
    assert "TF_VAR_region" not in env
