"""Corpus reading (errors name file and line), the prompt-hash split, bucket-scheme edges."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from llm_lb_gym.data import (CorpusError, default_corpus_path, load_any, prompt_in_test,
                             read_corpus, read_length_table)
from llm_lb_gym.predictor.buckets import SCHEMES, BucketScheme


def _write(path, rows, gz=False):
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


ROW = {"prompt": "hello there", "task_type": "chat", "response_tokens_wordpiece": 12,
       "prompt_tokens_wordpiece": 3}


def test_read_plain_and_gzip_agree(tmp_path):
    rows = [ROW, dict(ROW, prompt="two", response_tokens_wordpiece="40", task_type="math")]
    a = read_corpus(_write(tmp_path / "a.jsonl", rows))
    b = read_corpus(_write(tmp_path / "b.jsonl.gz", rows, gz=True))
    assert a.prompts == b.prompts == ("hello there", "two")
    assert a.decode_tokens.tolist() == [12, 40]
    assert a.prompt_tokens.tolist() == [3, 3]
    assert a.task_names == ("chat", "math")


def test_missing_field_names_file_and_line(tmp_path):
    bad = {k: v for k, v in ROW.items() if k != "task_type"}
    p = _write(tmp_path / "c.jsonl", [ROW, ROW, bad])
    with pytest.raises(CorpusError, match=r"c\.jsonl:3: missing field\(s\) task_type"):
        read_corpus(p)


@pytest.mark.parametrize("line,msg", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps(dict(ROW, response_tokens_wordpiece="many")), "not an integer"),
    (json.dumps(dict(ROW, response_tokens_wordpiece=-1)), "must be >= 0"),
])
def test_bad_line_names_file_and_line(tmp_path, line, msg):
    p = _write(tmp_path / "d.jsonl", [ROW, line])
    with pytest.raises(CorpusError, match=rf"d\.jsonl:2: .*{msg}"):
        read_corpus(p)


def test_unreadable_corpus_names_file(tmp_path):
    p = tmp_path / "broken.jsonl.gz"
    whole = gzip.compress(("".join(json.dumps(dict(ROW, prompt=f"p{i}")) + "\n" for i in range(5000))).encode())
    p.write_bytes(whole[: len(whole) // 2])  # a download cut in the middle
    with pytest.raises(CorpusError, match=r"broken\.jsonl\.gz:\d+: unreadable corpus \(EOFError"):
        read_corpus(p)
    b = tmp_path / "binary.jsonl"
    b.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CorpusError, match=r"binary\.jsonl(:\d+)?: unreadable corpus \(UnicodeDecodeError"):
        read_corpus(b)
    with pytest.raises(CorpusError, match=r"nowhere\.jsonl: corpus file not found"):
        read_corpus(tmp_path / "nowhere.jsonl")
    with pytest.raises(CorpusError, match="no rows"):
        read_corpus(_write(tmp_path / "empty.jsonl", []))


def test_split_by_prompt_hash_is_disjoint_stable_and_sized(tmp_path):
    rows = [dict(ROW, prompt=f"prompt {i % 400}") for i in range(2000)]  # every prompt 5 times
    c = read_corpus(_write(tmp_path / "e.jsonl", rows))
    train, test = c.split("train", 0.2), c.split("test", 0.2)
    assert len(train) + len(test) == len(c)
    assert not set(train.prompts) & set(test.prompts)
    assert 0.12 < len(set(test.prompts)) / 400 < 0.28
    # SHA-1 based: fixed across processes and machines (Python's hash() is salted).
    assert prompt_in_test(["prompt 0", "prompt 1", "prompt 2", "prompt 3"], 0.5).tolist() == \
        [bool(int(__import__("hashlib").sha1(f"prompt {i}".encode()).hexdigest()[:8], 16) < 2**31)
         for i in range(4)]
    assert c.split("all") is c
    with pytest.raises(ValueError, match="split='dev' is not valid; allowed: train, test, all"):
        c.split("dev")


def test_csv_trace_reader(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nx,100,20\ny,5,0\n")
    c = load_any(p)
    assert c.prompt_tokens.tolist() == [100, 5] and c.decode_tokens.tolist() == [20, 0]
    assert c.task_types == ("default", "default") and len(set(c.prompts)) == 2
    with pytest.raises(CorpusError, match=r"t\.csv:1: missing column 'Gen'"):
        read_length_table(p, "ContextTokens", "Gen")
    p.write_text("ContextTokens,GeneratedTokens\n100,20\n7,abc\n")
    with pytest.raises(CorpusError, match=r"t\.csv:3: field 'GeneratedTokens'='abc' is not an integer"):
        load_any(p)


def test_bucket_scheme_edges_are_exact():
    dqn = SCHEMES["paper_dqn"]()
    assert dqn.bucket([0, 255, 256, 2047, 2048, 10**6]).tolist() == [0, 0, 1, 1, 2, 2]
    t4 = SCHEMES["time4"]()
    assert t4.edges_tokens == (30, 120, 240)  # 0.5, 2, 4 s at 60 tok/s
    assert t4.bucket([29, 30, 119, 120, 239, 240]).tolist() == [0, 1, 1, 2, 2, 3]
    assert [t4.bucket_of(x) for x in (29, 30, 119, 120, 239, 240)] == [0, 1, 1, 2, 2, 3]
    eq = BucketScheme.equal_width(250, 4)
    assert eq.bucket([249, 250, 499, 500, 750]).tolist() == [0, 1, 1, 2, 3]


def test_shared_corpus_reads_and_splits():
    path = default_corpus_path()
    if not path.is_file():
        pytest.skip(f"shared corpus not found at {path} (set LLM_LB_GYM_DATA)")
    c = read_corpus(path)
    assert len(c) == 20254
    test = c.split("test", 0.2)
    assert 0.15 < len(test) / len(c) < 0.25
    assert not set(test.prompts) & set(c.split("train", 0.2).prompts)
    assert np.all(c.prompt_tokens >= 1) and np.all(c.decode_tokens >= 0)
