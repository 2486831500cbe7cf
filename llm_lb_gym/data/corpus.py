"""Reading a prompt/response corpus and splitting it by prompt; reading token-length tables.

The predictors learn from real prompts and the lengths of real responses. The corpus is JSONL
(optionally gzipped), one object a line with at least ``prompt``, ``task_type`` and
``response_tokens_wordpiece``; ``prompt_tokens_wordpiece`` is used when present (else the prompt
is counted by whitespace words, and the row is flagged in ``prompt_tokens_counted``).

The same prompt appears many times (one row per answering model), so rows are split by a hash
of the prompt text, never by row: a held-out metric then measures prompts the model has never
seen. The hash is SHA-1 of the UTF-8 prompt, so the split is the same on every machine and
Python version (``hash()`` is salted per process).

Trace tables (CSV of prompt and decode token counts without text, e.g. the Azure trace) are
read by :func:`read_length_table`, for the metadata random forest.

Token counts must be integers in [0, ``limits.MAX_TOKENS``] (2**31 - 1); anything else raises
``CorpusError`` naming the file and line.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._validate import check_choice, check_range
from ..limits import MAX_TOKENS
from .store import dataset_path

REQUIRED_FIELDS = ("prompt", "task_type", "response_tokens_wordpiece")
SPLITS = ("train", "test", "all")
DEFAULT_CORPUS = "prompts_responses"
"""The registered corpus (``registry.DATASETS``) read when no path is given."""


class CorpusError(ValueError):
    """A corpus file is unreadable or a line lacks a field; the message names file and line."""


def default_corpus_path() -> Path:
    """Where the registered corpus is on this machine, or would be once fetched (not checked;
    ``store.locate(DEFAULT_CORPUS)`` checks it and says how to get it)."""
    return dataset_path(DEFAULT_CORPUS)


@dataclass(frozen=True)
class Corpus:
    """Columns of a corpus (or of a subset of it), one entry per row."""

    prompts: tuple[str, ...]
    task_types: tuple[str, ...]
    prompt_tokens: np.ndarray
    """int64 >= 1, prompt length in WordPiece tokens (the corpus's count)."""
    decode_tokens: np.ndarray
    """int64 >= 0, response length in WordPiece tokens (the label the buckets are cut from)."""
    source: str = ""
    """Path the rows were read from (recorded in saved models and metrics)."""

    def __post_init__(self) -> None:
        n = len(self.prompts)
        for name in ("task_types", "prompt_tokens", "decode_tokens"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Corpus.{name} has {len(getattr(self, name))} rows, expected {n}")

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def task_names(self) -> tuple[str, ...]:
        """Sorted distinct task types (the order used for task ids everywhere)."""
        return tuple(sorted(set(self.task_types)))

    def take(self, idx) -> "Corpus":
        idx = np.asarray(idx, dtype=np.int64)
        return Corpus(
            prompts=tuple(self.prompts[i] for i in idx),
            task_types=tuple(self.task_types[i] for i in idx),
            prompt_tokens=self.prompt_tokens[idx],
            decode_tokens=self.decode_tokens[idx],
            source=self.source,
        )

    def split(self, split: str, test_fraction: float = 0.2) -> "Corpus":
        """Rows whose prompt hashes into ``split`` ("train", "test" or "all")."""
        check_choice("split", split, SPLITS)
        if split == "all":
            return self
        test = prompt_in_test(self.prompts, test_fraction)
        return self.take(np.flatnonzero(test if split == "test" else ~test))

    def subsample(self, max_rows: int | None, seed: int) -> "Corpus":
        """At most ``max_rows`` rows, drawn without replacement (keeps all when None)."""
        if max_rows is None or max_rows >= len(self):
            return self
        rng = np.random.default_rng(seed)
        return self.take(np.sort(rng.choice(len(self), size=int(max_rows), replace=False)))


def prompt_in_test(prompts, test_fraction: float) -> np.ndarray:
    """Boolean mask: True where the prompt's SHA-1 falls in the first ``test_fraction`` of hashes."""
    check_range("test_fraction", test_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
    cut = int(test_fraction * 2**32)
    out = np.empty(len(prompts), dtype=bool)
    for i, p in enumerate(prompts):
        h = int.from_bytes(hashlib.sha1(p.encode("utf-8")).digest()[:4], "big")
        out[i] = h < cut
    return out


def _open_text(path: Path):
    """Open plain or gzipped text; the gzip magic bytes decide, not the suffix."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _as_count(value, field: str, where: str, lo: int) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        v = int(value)
        if v <= MAX_TOKENS and v != float(value):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise CorpusError(f"{where}: field {field!r}={value!r} is not an integer") from None
    if v < lo:
        raise CorpusError(f"{where}: field {field!r}={v} must be >= {lo}")
    if v > MAX_TOKENS:
        raise CorpusError(f"{where}: field {field!r}={value!r} exceeds the limit "
                          f"MAX_TOKENS={MAX_TOKENS} (llm_lb_gym.limits)")
    return v


def read_corpus(path, max_rows: int | None = None) -> Corpus:
    """Read a JSONL(.gz) corpus; any bad line raises CorpusError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: corpus file not found")
    prompts, tasks, ptoks, dtoks = [], [], [], []
    try:
        with _open_text(path) as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise CorpusError(f"{where}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise CorpusError(f"{where}: expected a JSON object, got {type(row).__name__}")
                missing = [f for f in REQUIRED_FIELDS if f not in row]
                if missing:
                    raise CorpusError(f"{where}: missing field(s) {', '.join(missing)}; "
                                      f"required: {', '.join(REQUIRED_FIELDS)}")
                prompt, task = row["prompt"], row["task_type"]
                if not isinstance(prompt, str) or not isinstance(task, str) or not task:
                    raise CorpusError(f"{where}: fields 'prompt' and 'task_type' must be strings "
                                      f"(task_type non-empty)")
                dtoks.append(_as_count(row["response_tokens_wordpiece"], "response_tokens_wordpiece", where, 0))
                if "prompt_tokens_wordpiece" in row:
                    ptoks.append(max(1, _as_count(row["prompt_tokens_wordpiece"], "prompt_tokens_wordpiece", where, 0)))
                else:
                    ptoks.append(max(1, len(prompt.split())))
                prompts.append(prompt)
                tasks.append(task)
                if max_rows is not None and len(prompts) >= max_rows:
                    break
    except (OSError, EOFError, UnicodeDecodeError) as e:
        line = f":{lineno}" if "lineno" in locals() else ""
        raise CorpusError(f"{path}{line}: unreadable corpus ({type(e).__name__}: {e})") from None
    if not prompts:
        raise CorpusError(f"{path}: corpus has no rows")
    return Corpus(tuple(prompts), tuple(tasks), np.asarray(ptoks, np.int64),
                  np.asarray(dtoks, np.int64), source=str(path))


def read_length_table(path, prompt_column: str, decode_column: str, task_name: str = "default") -> Corpus:
    """Read a CSV trace of token counts (no text) as a corpus whose prompts are empty strings.

    Every row gets the task ``task_name`` (a trace is one application). Each row's "prompt" is
    its line tag ``"#<line>"``, so the split by prompt hash becomes a split by row, which is
    right for a trace whose requests are all distinct.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: trace file not found")
    prompts, ptoks, dtoks = [], [], []
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames or []
        for col in (prompt_column, decode_column):
            if col not in cols:
                raise CorpusError(f"{path}:1: missing column {col!r}; columns: {', '.join(cols)}")
        for lineno, row in enumerate(reader, start=2):
            where = f"{path}:{lineno}"
            ptoks.append(max(1, _as_count(row[prompt_column], prompt_column, where, 0)))
            dtoks.append(_as_count(row[decode_column], decode_column, where, 0))
            prompts.append(f"#{lineno}")
    if not prompts:
        raise CorpusError(f"{path}: trace has no rows")
    return Corpus(tuple(prompts), (task_name,) * len(prompts), np.asarray(ptoks, np.int64),
                  np.asarray(dtoks, np.int64), source=str(path))


def load_any(path, *, prompt_column: str = "ContextTokens", decode_column: str = "GeneratedTokens",
             task_name: str = "default") -> Corpus:
    """JSONL corpus, or a CSV trace when the file name ends in ``.csv``."""
    if str(path).endswith(".csv"):
        return read_length_table(path, prompt_column, decode_column, task_name)
    return read_corpus(path)

