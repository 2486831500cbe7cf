"""Vectorised inference for the light model's fitted scikit-learn pipeline, same predictions.

``HashingVectorizer -> TfidfTransformer -> LogisticRegression`` spends most of a batch in
Python: it builds a string per word n-gram and hashes them one at a time (about 11,000 per
batch of 64 prompts here). This computes the same features with whole-batch numpy operations:
tokens are found in C (a byte translation table for ASCII prompts, the pipeline's own regex
otherwise), every n-gram is a span of one byte buffer, MurmurHash3 (32-bit, seed 0: what
scikit-learn uses) runs over all spans at once, and each document's TF-IDF norm and class
scores are segment sums over one packed (idf, idf x coefficients) row per n-gram. The
predicted classes equal the pipeline's on all 20,254 corpus prompts for every saved light model
here (probabilities within 2e-6; tests/test_predictor_models.py checks a small case);
docs/predictor.md has the times.
Training still uses scikit-learn; this is built from the fitted pipeline at load.
"""

from __future__ import annotations

import itertools
import re

import numpy as np

TOKEN_PATTERN = r"(?u)\b\w+\b"
_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
_TAIL_MASK = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], np.uint32)
# ASCII bytes that are not \w (letters, digits, underscore) become spaces, then bytes.split().
_ASCII_WORDS = bytes(c if (chr(c).isalnum() or c == ord("_")) and c < 128 else 32 for c in range(256))


def _rotl_(x: np.ndarray, r: int, tmp: np.ndarray) -> None:
    """x = rotate-left(x, r), in place (uint32)."""
    np.left_shift(x, np.uint32(r), out=tmp)
    x >>= np.uint32(32 - r)
    x |= tmp


def murmur3_spans(buf: bytes, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Signed 32-bit MurmurHash3 (seed 0) of ``buf[s: s + n]`` for every (s, n), vectorised."""
    b = np.frombuffer(buf + b"\0\0\0\0", np.uint8).astype(np.uint32)
    words = b[:-3] | (b[1:-2] << np.uint32(8)) | (b[2:-1] << np.uint32(16)) | (b[3:] << np.uint32(24))
    # Longest first, so the spans with a k-th block are a prefix; int16 keys sort by radix.
    nblocks = lengths // 4
    if len(nblocks) and nblocks.max() < 2 ** 15:
        nblocks = nblocks.astype(np.int16)
    order = np.argsort(-nblocks, kind="stable")
    off, n = starts[order], lengths[order]
    with_block = len(n) - np.cumsum(np.bincount(nblocks))[:-1]  # spans with more than k blocks
    h = np.zeros(len(n), np.uint32)
    kk, tmp = np.empty_like(h), np.empty_like(h)
    with np.errstate(over="ignore"):
        for m in with_block.tolist():
            k, t, hm = kk[:m], tmp[:m], h[:m]
            np.take(words, off[:m], out=k)
            off[:m] += 4
            k *= _C1
            _rotl_(k, 15, t)
            k *= _C2
            hm ^= k
            _rotl_(hm, 13, t)
            hm *= np.uint32(5)
            hm += np.uint32(0xE6546B64)
        np.take(words, off, out=kk)  # off now points at each tail
        kk &= _TAIL_MASK[n & 3]  # 0 when there is no tail: the steps below are then a no-op
        kk *= _C1
        _rotl_(kk, 15, tmp)
        kk *= _C2
        h ^= kk
        h ^= n.astype(np.uint32)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    out = np.empty(len(n), np.int32)
    out[order] = h.view(np.int32)
    return out


class HashedNgramClassifier:
    """``predict_proba(texts)`` of a fitted light pipeline, vectorised over the batch."""

    def __init__(self, pipeline) -> None:
        hv, tfidf, lr = (step for _, step in pipeline.steps)
        self.n_features = int(hv.n_features)
        self.ngram_max = int(hv.ngram_range[1])
        idf = np.asarray(tfidf.idf_, np.float64)
        # One row per column: idf, then idf x coefficient of each class. A batch reads one row
        # per n-gram (the table is 10 MB: reading two tables cost two cache misses per n-gram).
        self.table = np.column_stack([idf, idf[:, None] * np.asarray(lr.coef_, np.float64).T])
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
        """The pipeline's tokens (maximal runs of \\w in the lowercased text), UTF-8 encoded."""
        low = text.lower()
        if low.isascii():
            return low.encode("ascii").translate(_ASCII_WORDS).split()
        words = self.pattern.findall(low)
        return " ".join(words).encode("utf-8").split(b" ") if words else []

    def _ngrams(self, texts):
        """(document index, hashed column) of every n-gram occurrence."""
        per_doc = [self._tokens(t) for t in texts]
        counts = np.fromiter(map(len, per_doc), np.int64, len(per_doc))
        # Tokens hold no space byte (UTF-8 uses 0x20 for nothing else), so the spaces of the
        # joined buffer delimit them.
        buf = b" ".join(itertools.chain.from_iterable(per_doc))
        gaps = np.flatnonzero(np.frombuffer(buf, np.uint8) == 32)
        n = int(counts.sum())
        starts = np.zeros(n, np.int64)
        starts[1:] = gaps + 1
        ends = np.full(n, len(buf), np.int64)
        ends[:-1] = gaps
        doc = np.repeat(np.arange(len(per_doc)), counts)
        span_s, span_e, span_doc = [starts], [ends], [doc]
        for k in range(1, self.ngram_max):  # n-gram of k+1 tokens: first token's start to last's end
            same = doc[:-k] == doc[k:]
            span_s.append(starts[:-k][same])
            span_e.append(ends[k:][same])
            span_doc.append(doc[:-k][same])
        s = np.concatenate(span_s)
        h = murmur3_spans(buf, s, np.concatenate(span_e) - s).astype(np.int64)
        col = np.abs(h) % self.n_features
        col[h == -(2 ** 31)] = (2 ** 31 - 1 - (self.n_features - 1)) % self.n_features  # as scikit-learn
        return np.concatenate(span_doc), col

    def predict_proba(self, texts) -> np.ndarray:
        """Rows x = (1 + log tf) idf / ||.||, then softmax(x coef + intercept), as the pipeline
        (in float64 where it rounds to float32: probabilities agree to about 1e-6)."""
        texts = list(texts)
        n = len(texts)
        doc, col = self._ngrams(texts)
        key, tf = np.unique(doc * self.n_features + col, return_counts=True)
        doc, col = key // self.n_features, key % self.n_features
        w = self.table[col] * (1.0 + np.log(tf))[:, None]  # tf-idf, and tf-idf x coef per class
        w[:, 0] **= 2
        sums = np.zeros((n, w.shape[1]))
        starts = np.searchsorted(doc, np.arange(n))
        rows = np.flatnonzero(np.diff(np.append(starts, len(doc))) > 0)  # documents with an n-gram
        if len(rows):
            sums[rows] = np.add.reduceat(w, starts[rows], axis=0)
        norm = np.sqrt(sums[:, 0])
        z = sums[:, 1:] / np.where(norm > 0, norm, 1.0)[:, None] + self.intercept
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)
