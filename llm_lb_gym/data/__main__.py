"""``python -m llm_lb_gym.data list | info NAME | fetch NAME... | verify [NAME...] | path NAME``.

``list`` shows every dataset and where (if anywhere) a copy is; ``info`` its source, license
and citation; ``fetch`` downloads (or, with ``--from FILE``, copies a file you downloaded) and
checks it against the registered SHA-256; ``verify`` checks every copy found; ``path`` prints
the checked file's path (for shell use: ``data.path=$(python -m llm_lb_gym.data path azure_conv)``).
Exit status: 0 on success, 1 when a file is missing or wrong (``verify`` without names: when
no dataset at all is found), 2 on a usage error (such as an unknown name).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .._validate import ConfigError
from .registry import DATASETS, get_dataset
from .store import (DATA_ENV_VAR, DataError, data_roots, dataset_path, download_dir, fetch,
                    locate, verify)


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _where() -> str:
    roots = "\n".join(f"  {i}. {root} ({origin}{'' if root.is_dir() else ', absent'})"
                      for i, (root, origin) in enumerate(data_roots(), start=1))
    return (f"Data directories, searched in order (set {DATA_ENV_VAR} to use only one):\n{roots}\n"
            f"fetch writes to {download_dir()}")


def cmd_list(args) -> int:
    rows = [("name", "kind", "format", "size", "rows", "license", "on this machine")]
    for ds in DATASETS.values():
        path = dataset_path(ds)
        here = str(path) if path.is_file() else ("missing" if ds.downloadable else
                                                  "missing (no public download)")
        license_ = ds.license.split(" (")[0].split(";")[0].split(":")[0]
        rows.append((ds.name, ds.kind, ds.format or "-", _size(ds.size_bytes),
                     f"{ds.rows:,}" if ds.rows else "-", license_, here))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    print()
    print(_where())
    print("Details and citation: python -m llm_lb_gym.data info NAME")
    return 0


def cmd_info(args) -> int:
    ds = get_dataset(args.name)
    path = dataset_path(ds)
    fields = [("name", ds.name), ("kind", ds.kind + (f", format {ds.format}" if ds.format else "")),
              ("description", ds.description), ("file", ds.path),
              ("size", f"{ds.size_bytes:,} bytes"), ("rows", f"{ds.rows:,}" if ds.rows else "-"),
              ("sha256", ds.sha256), ("license", ds.license), ("citation", ds.citation),
              ("homepage", ds.homepage or "-"),
              ("download", ("\n" + " " * 13).join(ds.urls) if ds.urls else "none (see note)"),
              ("note", ds.note or "-"),
              ("here", str(path) if path.is_file() else f"missing; fetch writes {path}")]
    for key, value in fields:
        print(f"{key + ':':<12} {value}")
    return 0


def _progress(name: str):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    bar = None

    def update(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="B", unit_scale=True, desc=name, leave=False, disable=None)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()
    return update


def cmd_fetch(args) -> int:
    names = list(DATASETS) if args.all else args.names
    if not names:
        raise ConfigError("fetch needs dataset names or --all; allowed names: "
                          + ", ".join(DATASETS))
    if args.source is not None and len(names) != 1:
        raise ConfigError("--from takes one dataset name")
    status = 0
    for name in names:
        ds = get_dataset(name)
        if args.all and not ds.downloadable:
            print(f"{name}: skipped (no public download; see `info {name}`)")
            continue
        try:
            path = fetch(ds, args.source, force=args.force,
                         progress=None if args.quiet else _progress(name))
        except DataError as err:
            print(f"{name}: {err}", file=sys.stderr)
            status = 1
            continue
        print(f"{name}: {path} (SHA-256 checked)")
    return status


def cmd_verify(args) -> int:
    """Exit 1 on a mismatch, on a named dataset that is missing, or when no dataset at all is
    found (nothing was verified: a wrong ``LLM_LB_GYM_DATA`` must not pass as success)."""
    status = 0
    results = verify(args.names or None)
    for r in results:
        if r.status == "ok":
            print(f"{r.name}: ok  {r.path}")
        elif r.status == "missing":
            print(f"{r.name}: missing")
            status = status or (1 if args.names else 0)
        else:
            print(f"{r.name}: MISMATCH  {r.detail}")
            status = 1
    if not args.names and all(r.status == "missing" for r in results):
        print(f"error: no dataset found, nothing verified.\n{_where()}\n"
              "Fetch one with: python -m llm_lb_gym.data fetch NAME", file=sys.stderr)
        status = 1
    return status


def cmd_path(args) -> int:
    try:
        print(locate(args.name))
    except DataError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llm_lb_gym.data",
                                     description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every dataset, and where a copy is").set_defaults(run=cmd_list)
    p = sub.add_parser("info", help="source, license, citation of one dataset")
    p.add_argument("name")
    p.set_defaults(run=cmd_info)
    p = sub.add_parser("fetch", help="download datasets (checked against their SHA-256)")
    p.add_argument("names", nargs="*", metavar="NAME")
    p.add_argument("--all", action="store_true", help="every dataset with a public download")
    p.add_argument("--from", dest="source", metavar="FILE_OR_URL",
                   help="take the file from here instead of the registered URLs")
    p.add_argument("--force", action="store_true", help="fetch even if a checked copy exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=cmd_fetch)
    p = sub.add_parser("verify", help="check every copy found (all datasets by default)")
    p.add_argument("names", nargs="*", metavar="NAME")
    p.set_defaults(run=cmd_verify)
    p = sub.add_parser("path", help="print the checked path of one dataset's file")
    p.add_argument("name")
    p.set_defaults(run=cmd_path)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
