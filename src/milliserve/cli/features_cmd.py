"""``milliserve features``: the online feature store."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_features_parser"]


def _features_load(args: argparse.Namespace) -> int:
    from milliserve.features.store import write_table_to_redis

    n = write_table_to_redis(args.table, args.key, args.redis, args.prefix)
    print(f"wrote {n} entities from {args.table} to {args.redis} as hashes {args.prefix}<{args.key}>")
    return 0


def add_features_parser(sub: Any) -> None:
    """``features load``."""
    fe = sub.add_parser("features", help="online feature store")
    fsub = fe.add_subparsers(dest="features_command", required=True)
    fl = fsub.add_parser("load", help="materialise a feature table (CSV or Parquet) into Redis hashes")
    fl.add_argument("table", type=Path)
    fl.add_argument("--redis", required=True, help="redis://host:port/db")
    fl.add_argument("--key", default="id", help="the entity id column (default id)")
    fl.add_argument("--prefix", default="", help="hash key prefix, e.g. user: (default none)")
    fl.set_defaults(func=_features_load)
