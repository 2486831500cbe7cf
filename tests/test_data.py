"""The dataset registry, the data directories, checksums, fetching and the command line.

Nothing here touches the network or the user's real cache: data directories are temporary
folders, and "downloads" come from ``file://`` URLs or local files.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.data import (DATASETS, TRACE_FORMATS, ChecksumError, DataNotFoundError, Dataset,
                             fetch, get_dataset, locate, read_trace, store, trace_datasets, verify)
from llm_lb_gym.data.__main__ import main as cli
from llm_lb_gym.workload import (WORKLOADS, make_workload, synthetic_arrival_workloads,
                                 uses_synthetic_arrivals)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"
AZURE = FIXTURES / "tiny_azure.csv"


def _dataset(source: Path, name: str = "tiny", urls: tuple[str, ...] | None = None) -> Dataset:
    """A registry entry for ``source`` (its real SHA-256), downloadable from its file:// URL."""
    data = source.read_bytes()
    return Dataset(name, f"traces/{name}.csv", hashlib.sha256(data).hexdigest(), len(data),
                   "trace", "CC0-1.0", "nobody", "", "a test trace",
                   urls=(source.as_uri(),) if urls is None else urls, format="azure", rows=24)


@pytest.fixture
def data_dir(tmp_path, monkeypatch) -> Path:
    """``$LLM_LB_GYM_DATA`` pointed at an empty temporary folder."""
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv("LLM_LB_GYM_DATA", str(root))
    return root


@pytest.fixture
def two_roots(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """No ``$LLM_LB_GYM_DATA``: a fake sibling ../shared/data and a fake user cache."""
    sibling, cache = tmp_path / "shared" / "data", tmp_path / "cache"
    monkeypatch.delenv("LLM_LB_GYM_DATA", raising=False)
    monkeypatch.setattr(store, "sibling_data_dir", lambda: sibling)
    monkeypatch.setattr(store, "user_cache_dir", lambda: cache)
    return sibling, cache


def _place(root: Path, ds: Dataset, data: bytes) -> Path:
    path = root / ds.path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# -- the registry -------------------------------------------------------------------------------
def test_registry_entries_are_complete():
    assert len(DATASETS) >= 10
    for name, ds in DATASETS.items():
        assert ds.name == name and re.fullmatch(r"[0-9a-f]{64}", ds.sha256)
        assert ds.size_bytes > 0 and ds.license and ds.citation and ds.description
        assert all(u.startswith("https://") for u in ds.urls), name
        assert ds.urls or ds.note, f"{name}: no download and no note saying how to get it"
        assert (ds.kind == "trace") == (ds.format in TRACE_FORMATS)
    assert len({ds.path for ds in DATASETS.values()}) == len(DATASETS)


def test_registered_traces_are_workloads_and_synthetic_arrivals_follow_the_format():
    for name, ds in trace_datasets().items():
        assert name in WORKLOADS
        assert uses_synthetic_arrivals(name) == (not TRACE_FORMATS[ds.format].has_timestamps)
    expected = {"task_mix", "corpus", "conversation"} | {
        n for n, d in trace_datasets().items() if d.format == "lengths"}
    assert set(synthetic_arrival_workloads()) == expected
    assert uses_synthetic_arrivals("trace", {"format": "lengths"})
    assert not uses_synthetic_arrivals("trace", {"format": "mooncake"})
    with pytest.raises(ConfigError, match="unknown workload 'nope'; allowed: .*azure_conv"):
        uses_synthetic_arrivals("nope")


def test_trace_workload_options_are_checked_by_name():
    with pytest.raises(ConfigError, match="format='csv' is not valid; allowed: azure, lengths, mooncake, burstgpt"):
        make_workload("trace", path=str(AZURE), format="csv")
    with pytest.raises(ConfigError, match="trace needs format=...; allowed: azure"):
        make_workload("trace", path=str(AZURE))
    with pytest.raises(ConfigError, match="mooncake needs path="):
        make_workload("mooncake")
    with pytest.raises(ConfigError, match="format"):
        make_workload("azure_conv", format="azure")   # a registered trace's format is fixed


def test_unknown_dataset_lists_the_names():
    with pytest.raises(ConfigError, match="unknown dataset 'azure'; allowed: .*azure_conv"):
        get_dataset("azure")


def test_bad_entries_are_rejected():
    good = _dataset(AZURE)
    with pytest.raises(ValueError, match="sha256"):
        replace(good, sha256="0" * 63)
    with pytest.raises(ValueError, match="format"):
        replace(good, format="parquet")
    with pytest.raises(ValueError, match="kind"):
        replace(good, kind="model")


def test_shared_copies_match_their_registered_checksums():
    """The developers' ../shared/data copies (where present) are what the registry pins."""
    sibling = store.sibling_data_dir()
    present = [ds for ds in DATASETS.values() if (sibling / ds.path).is_file()]
    if not present:
        pytest.skip(f"no shared data at {sibling}")
    for ds in present:
        store.check_file(ds, sibling / ds.path)


# -- finding a dataset --------------------------------------------------------------------------
def test_missing_dataset_says_where_it_looked_and_how_to_get_it(data_dir):
    ds = get_dataset("azure_conv")
    with pytest.raises(DataNotFoundError) as info:
        locate(ds)
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert str(data_dir / ds.path) in message.splitlines()[0] and "$LLM_LB_GYM_DATA" in message
    assert "python -m llm_lb_gym.data fetch azure_conv" in message
    assert ds.urls[0] in message and ds.sha256 in message and "path=" in message


def test_a_dataset_without_public_download_says_so(data_dir):
    with pytest.raises(DataNotFoundError, match="no public download: assembled by"):
        locate("prompts_responses")
    with pytest.raises(DataNotFoundError, match="cannot be fetched"):
        fetch("prompts_responses")


def test_sibling_copy_comes_first_then_the_cache(two_roots):
    sibling, cache = two_roots
    ds = _dataset(AZURE)
    in_cache = _place(cache, ds, AZURE.read_bytes())
    assert locate(ds) == in_cache
    in_sibling = _place(sibling, ds, AZURE.read_bytes())
    assert locate(ds) == in_sibling
    in_sibling.write_bytes(AZURE.read_bytes()[:-1])   # a bad sibling copy is an error, not skipped
    with pytest.raises(ChecksumError, match=f"{re.escape(str(in_sibling))}: {ds.size_bytes - 1:,} bytes"):
        locate(ds)


def test_env_var_is_the_only_place_searched(two_roots, data_dir):
    sibling, _ = two_roots
    ds = _dataset(AZURE)
    _place(sibling, ds, AZURE.read_bytes())
    with pytest.raises(DataNotFoundError, match=re.escape(str(data_dir))):
        locate(ds)
    assert store.download_dir() == data_dir


def test_user_cache_without_platformdirs_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "platformdirs", None)   # import fails
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert store.user_cache_dir() == tmp_path / "llm_lb_gym"


def test_corrupt_copy_names_file_and_checksums(data_dir):
    ds = _dataset(AZURE)
    path = _place(data_dir, ds, AZURE.read_bytes().replace(b"943", b"944"))
    with pytest.raises(ChecksumError) as info:
        locate(ds)
    message = str(info.value)
    assert str(path) in message and ds.sha256 in message and hashlib.sha256(path.read_bytes()).hexdigest() in message
    assert "fetch tiny" in message and "path=" in message


# -- fetching -----------------------------------------------------------------------------------
def test_fetch_from_file_url_checks_and_is_idempotent(data_dir):
    ds = _dataset(AZURE)
    path = fetch(ds)
    assert path == data_dir / ds.path and path.read_bytes() == AZURE.read_bytes()
    stamp = path.stat().st_mtime_ns
    assert fetch(ds) == path and path.stat().st_mtime_ns == stamp   # present and checked: kept
    assert read_trace(locate(ds), "azure").prompt_tokens[0] == 943


def test_fetch_tries_sources_in_order_and_reports_each_failure(data_dir, tmp_path):
    other = tmp_path / "other.csv"
    other.write_bytes(AZURE.read_bytes()[:100])
    ds = _dataset(AZURE, urls=((tmp_path / "absent.csv").as_uri(), other.as_uri()))
    with pytest.raises(DataNotFoundError) as info:
        fetch(ds)
    message = str(info.value)
    assert "absent.csv" in message and "other.csv: got 100 bytes" in message
    assert ds.sha256 in message and "Fetch it with" not in message   # the manual steps only
    assert not [p for p in data_dir.rglob("*") if p.is_file()]   # nothing left behind
    ds = replace(ds, urls=ds.urls + (AZURE.as_uri(),))
    assert fetch(ds).read_bytes() == AZURE.read_bytes()


def test_fetch_from_a_downloaded_file_replaces_a_corrupt_copy(data_dir):
    ds = _dataset(AZURE, urls=("https://example.invalid/tiny.csv",))
    bad = _place(data_dir, ds, b"TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(ChecksumError):
        locate(ds)
    assert fetch(ds, str(AZURE)) == bad and bad.read_bytes() == AZURE.read_bytes()


def test_fetch_rejects_a_source_larger_than_the_dataset(data_dir, tmp_path):
    big = tmp_path / "big.csv"
    big.write_bytes(AZURE.read_bytes() + b"2024-03-01 12:00:59.0000000,1,1\n")
    with pytest.raises(DataNotFoundError, match="more than the expected"):
        fetch(_dataset(AZURE), str(big))
    assert not list(data_dir.rglob("*.part"))


# -- the command line ---------------------------------------------------------------------------
@pytest.fixture
def tiny_registered(monkeypatch) -> Dataset:
    ds = _dataset(AZURE)
    monkeypatch.setitem(DATASETS, ds.name, ds)
    return ds


def test_cli_list_info_and_path(data_dir, tiny_registered, capsys):
    assert cli(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in DATASETS) and str(data_dir) in out
    assert cli(["info", "burstgpt_1"]) == 0
    out = capsys.readouterr().out
    assert "BurstGPT" in out and "CC-BY-4.0" in out and "releases/download/v2.0" in out
    assert cli(["path", "tiny"]) == 1 and "fetch tiny" in capsys.readouterr().err
    assert cli(["info", "nope"]) == 2 and "allowed:" in capsys.readouterr().err


def test_cli_fetch_and_verify(data_dir, tiny_registered, capsys):
    assert cli(["fetch"]) == 2
    assert cli(["fetch", "tiny", "--quiet"]) == 0
    assert f"tiny: {data_dir / tiny_registered.path} (SHA-256 checked)" in capsys.readouterr().out
    assert cli(["path", "tiny"]) == 0
    assert capsys.readouterr().out.strip() == str(data_dir / tiny_registered.path)
    assert cli(["verify", "tiny"]) == 0 and "tiny: ok" in capsys.readouterr().out
    assert cli(["verify"]) == 0   # others missing: listed, not an error
    assert "azure_conv: missing" in capsys.readouterr().out
    assert cli(["verify", "azure_conv"]) == 1   # asked for by name and missing
    (data_dir / tiny_registered.path).write_bytes(b"x")
    assert cli(["verify"]) == 1 and "tiny: MISMATCH" in capsys.readouterr().out
    assert cli(["fetch", "tiny", "--from", str(AZURE), "--quiet"]) == 0
    assert [r.status for r in verify(["tiny"])] == ["ok"]


def test_cli_fetch_failure_exits_1_with_the_manual_steps(data_dir, capsys):
    assert cli(["fetch", "azure_code", "--from", str(AZURE), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "could not fetch dataset 'azure_code'" in err and str(data_dir / "traces") in err


# -- workloads on registered datasets -------------------------------------------------------------
def test_registered_trace_workload_reads_the_checked_file(data_dir, tiny_registered, monkeypatch):
    from llm_lb_gym.workload import registry

    monkeypatch.setitem(registry.WORKLOADS, "tiny", registry._Trace("tiny", "azure", "tiny"))
    with pytest.raises(DataNotFoundError, match="fetch tiny"):
        make_workload("tiny")
    fetch(tiny_registered)
    w = make_workload("tiny", start="head")
    assert w.dataset == "tiny" and w.task_names == ("tiny",) and len(w.data) == 24
    own = make_workload("tiny", path=str(AZURE))   # path= replays a file of your own instead
    assert own.dataset is None and own.path == str(AZURE)


def test_cli_verify_fails_when_no_dataset_is_found(data_dir, capsys):
    """An empty or wrong data folder must not pass: nothing verified is an error."""
    assert cli(["verify"]) == 1
    captured = capsys.readouterr()
    assert "azure_conv: missing" in captured.out
    assert "no dataset found, nothing verified" in captured.err and str(data_dir) in captured.err


def test_failed_fetch_leaves_no_empty_folder(data_dir, capsys):
    """The download folder (and its traces/ subfolder) made for a failed fetch is removed."""
    assert not (data_dir / "traces").exists()
    assert cli(["fetch", "azure_code", "--from", str(AZURE), "--quiet"]) == 1
    assert list(data_dir.iterdir()) == []
    (data_dir / "traces").mkdir()
    (data_dir / "traces" / "keep.csv").write_text("x")   # a folder in use is kept
    assert cli(["fetch", "azure_code", "--from", str(AZURE), "--quiet"]) == 1
    assert [p.name for p in (data_dir / "traces").iterdir()] == ["keep.csv"]
