"""The JSON card saved beside every trained predictor, and the task hint it describes.

A saved model is a directory: the weights (Hugging Face files or a joblib pickle) plus
``predictor.json``. The card holds everything needed to use the weights the way they were
trained (bucket scheme, task hint and its template, task names, sequence length, inference
settings) and the held-out metrics, so ``make_predictor("transformer", path=...)`` restores a
predictor without any other configuration and a run can always say what it routed with.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .._validate import ConfigError, check_choice
from .buckets import SCHEMES, BucketScheme

CARD_FILE = "predictor.json"
METRICS_FILE = "metrics.json"
KINDS = ("transformer", "light", "forest")
TARGETS = ("bucket", "task")
DEFAULT_HINT_TEMPLATE = "This is a {task} task."


def add_task_hint(texts, tasks, template: str = DEFAULT_HINT_TEMPLATE) -> list[str]:
    """Prepend the hint to each prompt ("This is a <task> task. <prompt>").

    Prepended rather than appended (the paper appends) so that truncation to a short sequence
    length can never cut the hint off a long prompt.
    """
    if len(texts) != len(tasks):
        raise ValueError(f"{len(texts)} texts but {len(tasks)} task names")
    return [template.format(task=t) + " " + x for x, t in zip(texts, tasks)]


def restore_scheme(name: str, edges_tokens) -> BucketScheme:
    """A saved scheme: the named one of ``SCHEMES`` when its edges match (so it compares equal
    to what the environment builds), else a token scheme with exactly these edges."""
    edges = tuple(int(e) for e in edges_tokens)
    named = SCHEMES.get(name)
    if named is not None and named().edges_tokens == edges:
        return named()
    return BucketScheme(edges, name=name or "tokens")


def scheme_dict(scheme: BucketScheme) -> dict:
    """How metrics files record a scheme."""
    return {"name": scheme.name, "edges_tokens": list(scheme.edges_tokens), "labels": scheme.labels()}


@dataclass(frozen=True)
class ModelCard:
    """What a saved predictor is and how it was trained."""

    kind: str
    """Backend: "transformer", "light" (hashed n-grams + logistic regression) or "forest"."""
    target: str
    """"bucket" (decode-length bucket) or "task" (task-type classifier)."""
    label_names: tuple[str, ...]
    """Name of each output class (bucket labels such as "[0,30)", or task names)."""
    task_names: tuple[str, ...] = ()
    """Task types seen in training (hint vocabulary; the forest's one-hot columns)."""
    scheme_name: str = ""
    edges_tokens: tuple[int, ...] = ()
    """Bucket edges (bucket target only); the scheme is rebuilt from these, not from the name."""
    bucket_mean_tokens: tuple[float, ...] = ()
    """Mean true decode tokens of each bucket on the training split: the point estimate."""
    task_hint: bool = False
    hint_template: str = DEFAULT_HINT_TEMPLATE
    settings: dict = field(default_factory=dict)
    """Backend settings (base model, max_length, epochs, ..., inference options)."""
    train_data: dict = field(default_factory=dict)
    """Corpus path, split fraction, rows used, seed."""
    metrics: dict = field(default_factory=dict)
    """Held-out metrics measured right after training."""
    environment: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choice("card.kind", self.kind, KINDS)
        check_choice("card.target", self.target, TARGETS)
        for name in ("label_names", "task_names", "edges_tokens", "bucket_mean_tokens"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.target == "bucket" and len(self.edges_tokens) + 1 != len(self.label_names):
            raise ConfigError(f"card has {len(self.label_names)} labels but {len(self.edges_tokens)} "
                              f"bucket edges; expected edges = labels - 1")

    @property
    def scheme(self) -> BucketScheme:
        if self.target != "bucket":
            raise ConfigError(f"a {self.target} model has no bucket scheme")
        return restore_scheme(self.scheme_name, self.edges_tokens)

    def save(self, directory) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        env = dict(self.environment) or {"python": platform.python_version()}
        data = asdict(self) | {"environment": env}
        (d / CARD_FILE).write_text(json.dumps(data, indent=2) + "\n")
        return d / CARD_FILE

    @staticmethod
    def load(directory) -> "ModelCard":
        path = Path(directory) / CARD_FILE
        if not path.is_file():
            raise ConfigError(f"{path} not found: {directory} is not a saved predictor directory "
                              f"(train one with `python -m llm_lb_gym.experiments.train_predictor`)")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        known = set(ModelCard.__dataclass_fields__)
        missing = [k for k in ("kind", "target", "label_names") if k not in data]
        if missing:
            raise ConfigError(f"{path}: missing field(s) {', '.join(missing)}")
        return ModelCard(**{k: v for k, v in data.items() if k in known})

    def expect(self, kind: str, target: str, path) -> None:
        """Raise unless this card is of ``kind`` and ``target`` (clear error for a wrong path)."""
        if (self.kind, self.target) != (kind, target):
            raise ConfigError(f"{path} holds a {self.kind} {self.target} model; expected a {kind} {target} model")
