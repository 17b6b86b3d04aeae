"""``python -m gputap_common.settings``: generate what comes from the schema, or check settings.

python -m gputap_common.settings defaults > hub_config/defaults.yaml
python -m gputap_common.settings reference --write README.md
python -m gputap_common.settings helm-schema > helm/gputap/values.schema.json
python -m gputap_common.settings check [FILE]   # FILE, else $GPUTAP_SETTINGS, and GPUTAP__*
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .load import load_settings
from .render import defaults_yaml, helm_values_schema_json, reference_markdown, with_reference
from .validate import SettingsError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gputap_common.settings", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("defaults", help="print hub_config/defaults.yaml as the schema makes it")
    commands.add_parser("helm-schema", help="print the Helm chart's values.schema.json")
    reference = commands.add_parser("reference", help="print the README's settings reference")
    reference.add_argument(
        "--write", metavar="README", type=Path, help="replace the reference between its markers"
    )
    check = commands.add_parser("check", help="load the settings as gputap does; say what is wrong")
    check.add_argument("file", nargs="?", help="settings file (default: $GPUTAP_SETTINGS)")
    args = parser.parse_args(argv)

    if args.command == "defaults":
        sys.stdout.write(defaults_yaml())
    elif args.command == "helm-schema":
        sys.stdout.write(helm_values_schema_json())
    elif args.command == "reference" and args.write:
        args.write.write_text(with_reference(args.write.read_text()))
    elif args.command == "reference":
        print(reference_markdown())
    else:
        try:
            settings = load_settings(args.file)
        except SettingsError as e:
            print(e, file=sys.stderr)
            return 1
        print(f"settings OK ({settings.source or 'defaults and environment only'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
