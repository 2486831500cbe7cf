"""Where the shared data lives, and a missing-file error that says how to fix it.

The data (traces, corpora, profiles) is never copied into the repository: it is read in place
from ``$LLM_LB_GYM_DATA`` or, by default, from ``<repo>/../shared/data`` (the project's layout),
found from this package's location so it works from any working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV_VAR = "LLM_LB_GYM_DATA"


def default_data_dir() -> Path:
    """``$LLM_LB_GYM_DATA`` if set, else ``<repo root>/../shared/data``."""
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def resolve_data_file(relative: str, path: str | os.PathLike | None = None) -> Path:
    """The file ``path`` if given, else ``relative`` under the default data directory.

    Raises FileNotFoundError naming the place it looked and how to point elsewhere.
    """
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"trace file not found: {p}")
        return p
    base = default_data_dir()
    p = base / relative
    if not p.is_file():
        origin = f"${DATA_ENV_VAR}" if os.environ.get(DATA_ENV_VAR) else "<repo>/../shared/data"
        raise FileNotFoundError(
            f"data file not found: {p} (data directory {base}, from {origin}); set "
            f"{DATA_ENV_VAR} to the folder that holds {relative.split('/')[0]}/ or pass path=...")
    return p
