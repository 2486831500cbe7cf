"""Token counts beyond MAX_TOKENS are rejected where they are read (issue 10, item 4)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from llm_lb_gym.data import CorpusError, read_corpus, read_length_table
from llm_lb_gym.limits import MAX_TOKENS
from llm_lb_gym.workload import RequestBatch, TraceFormatError, TraceWorkload, read_trace

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
HUGE = [
    ("azure", AZURE + "2023-11-16 18:15:47.0,1e19,7\n", 3, "ContextTokens"),
    ("azure", AZURE + f"2023-11-16 18:15:47.0,12,{2**63}\n", 3, "GeneratedTokens"),
    ("lengths", f"num_prefill_tokens,num_decode_tokens\n10,5\n{MAX_TOKENS + 1},5\n", 3,
     "num_prefill_tokens"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens\n1,m,3,4\n2,m,3,1e300\n", 3,
     "Response tokens"),
    ("mooncake", '{"timestamp": 1, "input_length": 5, "output_length": 2}\n'
                 '{"timestamp": 2, "input_length": 1e25, "output_length": 2}\n', 2,
     "input_length"),
    ("mooncake", '{"timestamp": 1, "input_length": 5, "output_length": 2}\n'
                 f'{{"timestamp": 2, "input_length": 5, "output_length": {10**30}}}\n', 2,
     "output_length"),
]


@pytest.mark.parametrize("format,text,line,column", HUGE)
def test_huge_counts_name_file_line_column_and_the_bound(tmp_path, format, text, line, column):
    path = tmp_path / f"huge.{format}"
    path.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no numpy cast warning on the way
        with pytest.raises(TraceFormatError, match=f"MAX_TOKENS={MAX_TOKENS}") as info:
            read_trace(path, format)
        with pytest.raises(TraceFormatError):   # a workload over the file fails at construction
            TraceWorkload(str(path), format, start="head",
                          arrivals=None if format != "lengths" else _poisson())
    assert (info.value.path, info.value.line, info.value.column) == (str(path), line, column)


def _poisson():
    from llm_lb_gym.workload import PoissonArrivals
    return PoissonArrivals(5.0)


def test_the_bound_itself_is_accepted(tmp_path):
    path = tmp_path / "edge.csv"
    path.write_text(f"num_prefill_tokens,num_decode_tokens\n{MAX_TOKENS},{MAX_TOKENS}\n")
    data = read_trace(path, "lengths")
    assert data.prompt_tokens[0] == MAX_TOKENS == data.decode_tokens[0]


@pytest.mark.parametrize("value", ["1e25", "Infinity", str(10**30), "true"])
def test_corpus_counts_beyond_the_bound_or_not_integers(tmp_path, value):
    path = tmp_path / "c.jsonl"
    good = {"prompt": "hi", "task_type": "qa", "response_tokens_wordpiece": 3}
    path.write_text(json.dumps(good) + "\n"
                    + f'{{"prompt": "x", "task_type": "qa", "response_tokens_wordpiece": {value}}}\n')
    with pytest.raises(CorpusError, match=r"c\.jsonl:2: field 'response_tokens_wordpiece'"):
        read_corpus(path)


def test_length_table_counts_beyond_the_bound(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(f"ContextTokens,GeneratedTokens\n5,6\n{2**64},6\n")
    with pytest.raises(CorpusError, match=r"t\.csv:3: .*MAX_TOKENS"):
        read_length_table(path, "ContextTokens", "GeneratedTokens")


@pytest.mark.parametrize("prompt", [[1e19, 5.0], [2.5, 5.0], [np.nan, 5.0],
                                    np.array([2**64 - 1, 5], dtype=np.uint64),
                                    [MAX_TOKENS + 1, 5]])
def test_request_batch_rejects_counts_a_cast_would_wrap(prompt):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="prompt_tokens"):
            RequestBatch.from_arrays([0.0, 1.0], prompt, [3, 4])
