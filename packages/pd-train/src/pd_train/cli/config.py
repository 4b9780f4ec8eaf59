"""``pd-train config``: print a config resolved with its defaults and overrides."""

from __future__ import annotations

import argparse
from typing import Any

from pd_train.cli._common import add_config_args, config_source, is_toy_config

__all__ = ["add_parser", "config"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("config", help="print the resolved config, with defaults")
    add_config_args(p, optional=True)


def config(args: argparse.Namespace) -> int:
    from pd_train.config.run import to_yaml
    from pd_train.run import prepare

    if is_toy_config(args.config):  # the toy's resolved config, checked as `run` checks it
        import yaml

        from pd_train.cli import toy as toy_cli

        raw = toy_cli.load_toy_config(args.config, args.overrides)
        print(yaml.safe_dump(raw, sort_keys=False), end="")
        return 0
    # Validated as `pd-train compile` validates (the target, patterns, cadences), then printed
    # as written (paths not made absolute); weight and data files are not opened.
    source = config_source(args.config)
    prepared = prepare(source, args.overrides, for_run=False)
    config = prepared.config
    if not isinstance(source, dict):
        from pd_train.config.run import load_config

        config, _ = load_config(source, args.overrides)
    print(to_yaml(config), end="")
    return 0
