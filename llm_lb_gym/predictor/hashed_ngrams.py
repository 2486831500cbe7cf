"""Vectorised inference for the light model's fitted scikit-learn pipeline, same predictions.

``HashingVectorizer -> TfidfTransformer -> LogisticRegression`` spends most of a batch in
Python: it builds a string per word n-gram and hashes them one at a time (about 11,000 per
batch of 64 prompts here). This computes the same features with whole-batch numpy operations:
tokens are found in C (a byte translation table for ASCII prompts, the pipeline's own regex
otherwise), every n-gram is a span of one byte buffer, MurmurHash3 (32-bit, seed 0: what
scikit-learn uses) runs over all spans at once, and the TF-IDF row times the coefficient
matrix is a weighted bincount. The held-out predictions are identical to the pipeline's
(checked on the whole corpus, tests/test_predictor_models.py); docs/predictor.md has the times.
Training still uses scikit-learn; this is built from the fitted pipeline at load.
"""

from __future__ import annotations

import re

import numpy as np
import scipy.sparse as sp

TOKEN_PATTERN = r"(?u)\b\w+\b"
_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
_TAIL_MASK = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], np.uint32)
# ASCII bytes that are not \w (letters, digits, underscore) become spaces, then bytes.split().
_ASCII_WORDS = bytes(c if (chr(c).isalnum() or c == ord("_")) and c < 128 else 32 for c in range(256))


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def murmur3_spans(buf: bytes, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Signed 32-bit MurmurHash3 (seed 0) of ``buf[s: s + n]`` for every (s, n), vectorised."""
    b = np.frombuffer(buf + b"\0\0\0\0", np.uint8).astype(np.uint32)
    words = b[:-3] | (b[1:-2] << np.uint32(8)) | (b[2:-1] << np.uint32(16)) | (b[3:] << np.uint32(24))
    # Longest first, so the spans with a k-th block are a prefix; int16 keys sort by radix.
    order = np.argsort(-np.minimum(lengths // 4, 2 ** 15 - 1).astype(np.int16), kind="stable")
    s, n = starts[order], lengths[order]
    nblocks = n // 4
    h = np.zeros(len(s), np.uint32)
    with np.errstate(over="ignore"):
        for k in range(int(nblocks[0]) if len(s) else 0):
            m = int(np.searchsorted(-nblocks, -k, side="left"))  # spans with more than k blocks
            kk = _rotl(words[s[:m] + 4 * k] * _C1, 15) * _C2
            hk = _rotl(h[:m] ^ kk, 13)
            h[:m] = hk * np.uint32(5) + np.uint32(0xE6546B64)
        tail = words[s + 4 * nblocks] & _TAIL_MASK[n & 3]  # 0 when no tail: then a no-op
        h ^= _rotl(tail * _C1, 15) * _C2
        h ^= n.astype(np.uint32)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    out = np.empty(len(s), np.int32)
    out[order] = h.view(np.int32)
    return out


class HashedNgramClassifier:
    """``predict_proba(texts)`` of a fitted light pipeline, vectorised over the batch."""

    def __init__(self, pipeline) -> None:
        hv, tfidf, lr = (step for _, step in pipeline.steps)
        self.n_features = int(hv.n_features)
        self.ngram_max = int(hv.ngram_range[1])
        self.dtype = hv.dtype
        self.idf = np.asarray(tfidf.idf_, np.float64)
        self.coef_t = np.ascontiguousarray(np.asarray(lr.coef_, np.float64).T)  # (n_features, classes)
        self.intercept = np.asarray(lr.intercept_, np.float64)
        self.classes = lr.classes_
        self.pattern = re.compile(hv.token_pattern)

    @staticmethod
    def supports(pipeline) -> bool:
        """Whether the pipeline is the configuration this reproduces exactly (light.py's)."""
        if [name for name, _ in pipeline.steps] != ["hashingvectorizer", "tfidftransformer", "logisticregression"]:
            return False
        hv, tfidf, lr = (step for _, step in pipeline.steps)
        return (hv.analyzer == "word" and hv.lowercase and hv.token_pattern == TOKEN_PATTERN
                and hv.ngram_range[0] == 1 and hv.norm is None and not hv.alternate_sign and not hv.binary
                and hv.preprocessor is None and hv.tokenizer is None and hv.stop_words is None
                and not hv.strip_accents and hv.input == "content"
                and tfidf.sublinear_tf and tfidf.norm == "l2" and tfidf.use_idf
                and len(lr.classes_) > 2 and lr.coef_.shape[0] == len(lr.classes_))

    def _tokens(self, text: str) -> list[bytes]:
        low = text.lower()
        if low.isascii():
            return low.encode("ascii").translate(_ASCII_WORDS).split()
        words = self.pattern.findall(low)
        return " ".join(words).encode("utf-8").split(b" ") if words else []

    def _ngrams(self, texts):
        """(document index, hashed column) of every n-gram occurrence."""
        per_doc = [self._tokens(t) for t in texts]
        counts = np.fromiter(map(len, per_doc), np.int64, len(per_doc))
        tokens = [t for doc in per_doc for t in doc]
        lengths = np.fromiter(map(len, tokens), np.int64, len(tokens))
        starts = np.cumsum(lengths + 1) - (lengths + 1)
        doc = np.repeat(np.arange(len(per_doc)), counts)
        span_s, span_n, span_doc = [starts], [lengths], [doc]
        for k in range(1, self.ngram_max):  # n-gram of k+1 tokens: first token's start to last's end
            same = doc[:-k] == doc[k:]
            span_s.append(starts[:-k][same])
            span_n.append((starts[k:] + lengths[k:])[same] - starts[:-k][same])
            span_doc.append(doc[:-k][same])
        h = murmur3_spans(b" ".join(tokens), np.concatenate(span_s), np.concatenate(span_n)).astype(np.int64)
        col = np.abs(h) % self.n_features
        col[h == -(2 ** 31)] = (2 ** 31 - 1 - (self.n_features - 1)) % self.n_features  # as scikit-learn
        return np.concatenate(span_doc), col

    def predict_proba(self, texts) -> np.ndarray:
        texts = list(texts)
        doc, col = self._ngrams(texts)
        key, tf = np.unique(doc * self.n_features + col, return_counts=True)
        doc, col = key // self.n_features, key % self.n_features
        # The pipeline's float32 arithmetic: 1 + log(tf), times idf, L2-normalised per row.
        x = np.log(tf.astype(self.dtype)) + self.dtype(1)
        x = (x * self.idf[col]).astype(self.dtype)
        norm = np.sqrt(np.bincount(doc, weights=x.astype(np.float64) ** 2, minlength=len(texts)))
        x = x / np.where(norm > 0, norm, 1.0)[doc].astype(self.dtype)
        indptr = np.searchsorted(doc, np.arange(len(texts) + 1))
        z = sp.csr_matrix((x, col, indptr), shape=(len(texts), self.n_features)) @ self.coef_t + self.intercept
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)
