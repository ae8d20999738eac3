"""``python -m trainer {train,evaluate,export} --config PATH_OR_URI [dotted.key=value ...]``;
``python -m trainer presets`` lists the built-in models with their parameter counts.

The config is loaded and checked before torch is imported, so a typo costs a second,
not a process group.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from trainer.config import ConfigError, all_keys, load_config
from trainer.contract import RunLayout
from trainer.presets import preset_table
from trainer.runtime.restarts import read_earlier
from trainer.storage import StorageError, open_storage

EPILOG = (
    """\
overrides: dotted keys, values parsed as YAML, e.g. train.lr=1e-3 checkpoint.every_steps=50
keys: """
    + ", ".join(all_keys())
    + """

train runs under torchrun (python -m torch.distributed.run ... -m trainer train ...) or as
a single process; evaluate and export run as a single process. Outcomes are written to
<run_uri>/attempts/<n>.json."""
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Train, evaluate and export trainops models.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {
        "train": "train (and resume) a model; checkpoints, metrics, export and an attempt record",
        "evaluate": "evaluate exported model(s) on the dataset's eval split",
        "export": "write <run_uri>/export from the newest committed checkpoint",
    }
    for name, text in helps.items():
        sub = commands.add_parser(
            name,
            help=text,
            description=text,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.add_argument(
            "--config",
            required=True,
            metavar="PATH_OR_URI",
            help="YAML config: a local path or a storage URI (file://, s3://)",
        )
        sub.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    commands.add_parser("presets", help="list the built-in model presets and their parameter counts")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "presets":
        print(preset_table())
        return 0
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StorageError as exc:  # one line, not a traceback: a restart in place meets it again
        print(f"error: could not read the config {args.config}: {exc}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.INFO, format="[trainer] %(message)s", stream=sys.stdout)
    if args.command == "train":
        # An in-place restart after a stop, a completion or a program error ends here, before
        # torch loads: torchrun restarts workers whatever their exit code was.
        earlier = read_earlier(open_storage(config.run_uri), RunLayout(config.run_uri), os.environ)
        if earlier is not None and earlier.exit_code is not None:
            if os.environ.get("RANK", "0") == "0":
                print(f"trainer: restarted in place, exiting at once: {earlier.why}", file=sys.stderr)
            return earlier.exit_code
        # Deferred (PLC0415): torch loads only for the command that needs it, not for `presets`.
        from trainer.train import run_train  # noqa: PLC0415

        return run_train(config, earlier)
    if args.command == "evaluate":
        from trainer.evaluate import run_evaluate  # noqa: PLC0415 (deferred, as above)

        run_evaluate(config)
        return 0
    from trainer.export.folder import export_from_checkpoint  # noqa: PLC0415 (as above)

    export_from_checkpoint(config)
    return 0
