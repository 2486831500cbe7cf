"""Where the datasets live on this machine, checksum checks, and fetching them.

A dataset's file is looked for under data directories, in this order:

1. ``$LLM_LB_GYM_DATA`` if set: then it is the only place (an explicit choice wins).
2. The repository's sibling ``../shared/data`` (the developers' read-only copy), if present.
3. The user cache: ``platformdirs.user_cache_dir("llm_lb_gym")`` when platformdirs is
   installed, else ``$XDG_CACHE_HOME/llm_lb_gym`` or ``~/.cache/llm_lb_gym``.

Every directory has the same layout (``traces/``, ``text/``, ``profiling/``), so a copy made
anywhere can be pointed at. The first file found must match the registry's SHA-256 (hashed once
per process and file version); a mismatch is an error, never silently used. ``fetch`` writes to
``$LLM_LB_GYM_DATA`` if set, else to the user cache; nothing is downloaded unless asked.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from .registry import DATASETS, Dataset, get_dataset

DATA_ENV_VAR = "LLM_LB_GYM_DATA"
APP_NAME = "llm_lb_gym"
DOWNLOAD_TIMEOUT_S = 60.0
"""Socket timeout of one read while downloading."""
_CHUNK = 1 << 20


class DataError(Exception):
    """A dataset is missing, corrupt or could not be fetched; the message says what to do."""


class DataNotFoundError(DataError, FileNotFoundError):
    """No copy of a dataset on this machine (or every download source failed)."""


class ChecksumError(DataError, ValueError):
    """A file's bytes differ from the registry's SHA-256 or size."""


# -- directories --------------------------------------------------------------------------------
def sibling_data_dir() -> Path:
    """``<repository root>/../shared/data`` (found from this package's location)."""
    return Path(__file__).resolve().parents[3] / "shared" / "data"


def user_cache_dir() -> Path:
    """The platform's per-user cache directory for this package."""
    try:
        import platformdirs
    except ImportError:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(base).expanduser() / APP_NAME
    return Path(platformdirs.user_cache_dir(APP_NAME))


def data_roots() -> list[tuple[Path, str]]:
    """The data directories searched, in order, each with where it comes from."""
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        return [(Path(env).expanduser(), f"${DATA_ENV_VAR}")]
    return [(sibling_data_dir(), "the repository's ../shared/data"),
            (user_cache_dir(), "the user cache")]


def download_dir() -> Path:
    """Where ``fetch`` writes: ``$LLM_LB_GYM_DATA`` if set, else the user cache."""
    env = os.environ.get(DATA_ENV_VAR)
    return Path(env).expanduser() if env else user_cache_dir()


def default_data_dir() -> Path:
    """The first data directory that exists (``$LLM_LB_GYM_DATA`` if set, whether or not it
    exists); the user cache when none does."""
    roots = data_roots()
    if len(roots) == 1:
        return roots[0][0]
    return next((root for root, _ in roots if root.is_dir()), roots[-1][0])


# -- checksums ----------------------------------------------------------------------------------
def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@lru_cache(maxsize=64)
def _cached_sha256(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(path)


def check_file(dataset: Dataset, path: Path) -> None:
    """Raise ChecksumError unless ``path`` holds exactly the dataset's bytes."""
    stat = path.stat()
    if stat.st_size == dataset.size_bytes:
        actual = _cached_sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if actual == dataset.sha256:
            return
        found = f"SHA-256 {actual}"
    else:
        found = f"{stat.st_size:,} bytes"
    raise ChecksumError(
        f"{path}: {found}, but dataset {dataset.name!r} is {dataset.size_bytes:,} bytes with "
        f"SHA-256 {dataset.sha256}; the file is truncated, corrupt or another version. Delete it "
        f"and run `python -m llm_lb_gym.data fetch {dataset.name}`, or pass path=... to use it "
        "as a file of your own (not checked)")


# -- finding a dataset --------------------------------------------------------------------------
def _dataset(name_or_dataset: str | Dataset) -> Dataset:
    return name_or_dataset if isinstance(name_or_dataset, Dataset) else get_dataset(name_or_dataset)


def candidate_paths(name_or_dataset: str | Dataset) -> list[Path]:
    """Where the dataset's file may be, in search order."""
    ds = _dataset(name_or_dataset)
    return [root / ds.path for root, _ in data_roots()]


def dataset_path(name_or_dataset: str | Dataset) -> Path:
    """The first existing copy, else where ``fetch`` would put it (not checked, no error)."""
    ds = _dataset(name_or_dataset)
    found = next((p for p in candidate_paths(ds) if p.is_file()), None)
    return found if found is not None else download_dir() / ds.path


def _how_to_get(ds: Dataset, target: Path, fetch_hint: bool = True) -> str:
    if not ds.downloadable:
        return (f"It has no public download: {ds.note}. Put the file at {target} (SHA-256 "
                f"{ds.sha256}), set {DATA_ENV_VAR} to a folder holding {ds.path}, or pass "
                "path=... to use a file of your own.")
    fetch = f"Fetch it with `python -m llm_lb_gym.data fetch {ds.name}`. " if fetch_hint else ""
    return (f"{fetch}Offline: download {ds.urls[0]} ({ds.size_bytes:,} bytes, SHA-256 "
            f"{ds.sha256}) on a machine with internet and save it as {target} (or run `python -m "
            f"llm_lb_gym.data fetch {ds.name} --from <downloaded file>`), or set {DATA_ENV_VAR} "
            f"to a folder holding {ds.path}; or pass path=... to use a file of your own.")


def missing_message(name_or_dataset: str | Dataset) -> str:
    """Where the dataset was looked for, and every way to get it."""
    ds = _dataset(name_or_dataset)
    looked = "; ".join(f"{root / ds.path} (data directory {root}, from {origin})"
                       for root, origin in data_roots())
    return f"dataset {ds.name!r} not found at {looked}.\n{_how_to_get(ds, download_dir() / ds.path)}"


def locate(name_or_dataset: str | Dataset) -> Path:
    """The dataset's file, checked against its SHA-256.

    Raises DataNotFoundError (a FileNotFoundError) saying where it looked and how to fetch or
    place the file, or ChecksumError when the copy found is not the registered one.
    """
    ds = _dataset(name_or_dataset)
    for path in candidate_paths(ds):
        if path.is_file():
            check_file(ds, path)
            return path
    raise DataNotFoundError(missing_message(ds))


# -- fetching -----------------------------------------------------------------------------------
def _open_source(source: str, timeout_s: float):
    """A binary stream of ``source``: an http(s) or file URL, or a local path."""
    import urllib.parse
    import urllib.request   # here, not at the top: importing the package stays fast

    if urllib.parse.urlparse(source).scheme in ("http", "https", "file"):
        request = urllib.request.Request(source, headers={"User-Agent": f"{APP_NAME} data fetch"})
        return urllib.request.urlopen(request, timeout=timeout_s)
    return open(Path(source).expanduser(), "rb")


def _copy_checked(ds: Dataset, source: str, target: Path,
                  progress: Callable[[int, int], None] | None) -> None:
    """Copy ``source`` to ``target`` through a temporary file, hashing on the way; the target
    appears only when size and SHA-256 match. Folders made for it are removed again when it
    does not (a failed fetch leaves no empty data folder behind)."""
    made = [d for d in (target.parent, *target.parent.parents) if not d.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    digest, size = hashlib.sha256(), 0
    try:
        with _open_source(source, DOWNLOAD_TIMEOUT_S) as src, open(part, "wb") as out:
            while chunk := src.read(_CHUNK):
                size += len(chunk)
                if size > ds.size_bytes:
                    raise ChecksumError(f"more than the expected {ds.size_bytes:,} bytes")
                digest.update(chunk)
                out.write(chunk)
                if progress is not None:
                    progress(size, ds.size_bytes)
        if size != ds.size_bytes or digest.hexdigest() != ds.sha256:
            raise ChecksumError(f"got {size:,} bytes with SHA-256 {digest.hexdigest()}; "
                                f"expected {ds.size_bytes:,} bytes with SHA-256 {ds.sha256}")
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
        if not target.exists():
            for d in made:   # deepest first
                try:
                    d.rmdir()
                except OSError:   # not empty (another file landed there): keep it
                    break


def fetch(name_or_dataset: str | Dataset, source: str | None = None, *, force: bool = False,
          progress: Callable[[int, int], None] | None = None) -> Path:
    """Make the dataset available and return its checked path.

    A verified copy already present is returned as is (unless ``force``). Otherwise the file
    comes from ``source`` (a URL or a local file you downloaded) or else from the registry's
    URLs in turn, and is written under ``download_dir()`` only if its size and SHA-256 match.
    Raises DataNotFoundError listing every source tried and why it failed, with the manual steps.
    """
    ds = _dataset(name_or_dataset)
    target = download_dir() / ds.path
    if not force:
        try:
            return locate(ds)
        except DataNotFoundError:
            pass
        except ChecksumError:
            if not target.is_file():   # a bad copy elsewhere (read-only): report it
                raise
    sources = [source] if source is not None else list(ds.urls)
    if not sources:
        raise DataNotFoundError(f"dataset {ds.name!r} cannot be fetched. "
                                f"{_how_to_get(ds, target)}")
    failures = []
    for src in sources:
        try:
            _copy_checked(ds, src, target, progress)
            return target
        except (OSError, ChecksumError) as err:   # urllib's URLError is an OSError
            failures.append(f"{src}: {err}")
    raise DataNotFoundError(f"could not fetch dataset {ds.name!r}:\n  " + "\n  ".join(failures)
                            + f"\n{_how_to_get(ds, target, fetch_hint=False)}")


@dataclass(frozen=True)
class CopyStatus:
    """One copy of a dataset found (or not) on this machine."""

    name: str
    status: str
    """"ok", "mismatch" or "missing"."""
    path: Path | None
    detail: str = ""


def verify(names: list[str] | None = None) -> list[CopyStatus]:
    """Check every copy of the named datasets (all by default) in every data directory."""
    out = []
    for name in names if names is not None else list(DATASETS):
        ds = get_dataset(name)
        found = [p for p in candidate_paths(ds) if p.is_file()]
        if not found:
            out.append(CopyStatus(name, "missing", None))
        for path in found:
            try:
                check_file(ds, path)
                out.append(CopyStatus(name, "ok", path))
            except ChecksumError as err:
                out.append(CopyStatus(name, "mismatch", path, str(err)))
    return out

