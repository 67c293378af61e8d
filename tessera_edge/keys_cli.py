"""tessera-keys: make the Ed25519 keys that sign allocation records.

tessera-keys generate --out DIR [--key-id ID]
tessera-keys public PRIVATE.pem
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.record_keys import KeyFileError, fingerprint, public_pem
from tessera_cli import CliParser, Commands, config_from, exit_code
from tessera_edge.keyfiles import generate_key_files, public_key_of

DESCRIPTION = """\
Make the keys that sign tessera's allocation records.

tessera-scheduler signs every record with a private key; the NRI hook on each node
verifies it with the public key. Give each side only its half:

  tessera-keys generate --out keys --key-id k1
  kubectl -n tessera-system create secret generic tessera-record-signing \\
      --from-file=keys/private/
  kubectl -n tessera-system create secret generic tessera-record-verify \\
      --from-file=keys/public/

To rotate, generate a new key ID into the same DIR, update the verify Secret first, then
the signing Secret with signing-key-id naming the new key; both sides pick the change up
without a restart. See docs/record.md.
"""


@dataclass(frozen=True, slots=True)
class KeysConfig:
    command: str
    """generate or public."""
    out: str = ""
    key_id: str = "default"
    private_key: str = ""


def _parser() -> CliParser:
    commands = Commands("tessera-keys", DESCRIPTION)
    gen = commands.add(
        "generate",
        "write a new key pair: DIR/private/ID.pem and DIR/public/ID.pem",
        "Write a new Ed25519 key pair: DIR/private/ID.pem (mode 0600, for the scheduler's "
        "Secret) and DIR/public/ID.pem (for the nodes' Secret). The first key written to "
        "DIR/private is also named in DIR/private/signing-key-id. Existing files are never "
        "overwritten.",
        as_written=False,
    )
    gen.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    gen.add_argument(
        "--key-id",
        default="default",
        metavar="ID",
        help="the key's ID, written into every record it signs (default: %(default)s)",
    )
    pub = commands.add(
        "public",
        "print the public key of a private key file",
        "Print the public key (PEM) of a private key file, e.g. to rebuild the nodes' Secret "
        "from the scheduler's.",
        as_written=False,
    )
    pub.add_argument("private_key", metavar="PRIVATE.pem")
    return commands.parser


def main(argv: Sequence[str] | None = None) -> int:
    config = config_from(KeysConfig, _parser().parse_args(argv))
    try:
        if config.command == "generate":
            private, public = generate_key_files(config.out, config.key_id)
            print(f"wrote {private} (private: the scheduler's Secret only)")
            print(f"wrote {public} (public: the nodes' Secret)")
            print(f"fingerprint {fingerprint(public_key_of(public))}")
        else:
            sys.stdout.write(public_pem(public_key_of(config.private_key)).decode())
    except KeyFileError as exc:
        print(f"tessera-keys: error: {exc}", file=sys.stderr)
        return exit_code(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
