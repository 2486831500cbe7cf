"""Data the package reads: named datasets, where they live, and the readers for their formats.

- ``DATASETS`` (``registry.py``): every named dataset with its source URLs, SHA-256, size,
  license and citation. Request traces are also workloads of the same name.
- ``locate(name)`` / ``fetch(name)`` / ``verify()`` (``store.py``): find a checked copy under
  ``$LLM_LB_GYM_DATA``, the repository's ``../shared/data`` or the user cache; download one.
  From a shell: ``python -m llm_lb_gym.data list | fetch NAME | verify | info NAME``.
- ``read_trace(path, format)`` (``traces.py``) for every layout in ``TRACE_FORMATS``
  (``formats.py``: azure, lengths, mooncake, burstgpt), with errors naming file, line, column.
- ``read_corpus`` / ``read_length_table`` / ``load_any`` (``corpus.py``): prompt/response
  corpora and token-length tables, for the predictors and the corpus workload.

This layer sits below ``workload`` and ``predictor`` and imports neither; it needs numpy only.
"""

from .corpus import (DEFAULT_CORPUS, Corpus, CorpusError, default_corpus_path, load_any,
                     prompt_in_test, read_corpus, read_length_table)
from .formats import TRACE_FORMATS, ZERO_TOKEN_POLICIES, TraceFormat
from .registry import DATASETS, Dataset, get_dataset, trace_datasets
from .store import (DATA_ENV_VAR, ChecksumError, DataError, DataNotFoundError, data_roots,
                    dataset_path, default_data_dir, fetch, locate, sha256_file, user_cache_dir,
                    verify)
from .traces import TraceData, TraceFormatError, read_trace

__all__ = [
    "ChecksumError", "Corpus", "CorpusError", "DATASETS", "DATA_ENV_VAR", "DEFAULT_CORPUS", "DataError",
    "DataNotFoundError", "Dataset", "TRACE_FORMATS", "TraceData", "TraceFormat",
    "TraceFormatError", "ZERO_TOKEN_POLICIES", "data_roots", "dataset_path",
    "default_corpus_path", "default_data_dir", "fetch", "get_dataset", "load_any", "locate",
    "prompt_in_test", "read_corpus", "read_length_table", "read_trace", "sha256_file",
    "trace_datasets", "user_cache_dir", "verify",
]
