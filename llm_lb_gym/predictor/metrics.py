"""Classification metrics for bucket (and task) predictors, in plain numpy.

Accuracy alone flatters a predictor on skewed buckets (83% of the corpus is below 256 tokens,
so "always short" scores 83% under the DQN's scheme); balanced accuracy (mean per-class recall
over the classes present) and macro-F1 are reported beside it, with per-task accuracy and the
confusion matrix that the noisy "confusion" predictor replays in simulation. Definitions match
scikit-learn's ``balanced_accuracy_score`` and ``f1_score(average="macro")`` over the labels
0..num_classes-1 that occur in either truth or prediction (tests check the equality).
"""

from __future__ import annotations

import numpy as np


def confusion_matrix(y_true, y_pred, num_classes: int) -> np.ndarray:
    """Counts, rows = true class, columns = predicted class."""
    y_true = np.asarray(y_true, np.int64)
    y_pred = np.asarray(y_pred, np.int64)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true has shape {y_true.shape}, y_pred {y_pred.shape}")
    if len(y_true) and (min(y_true.min(), y_pred.min()) < 0 or max(y_true.max(), y_pred.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    cm = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(cm, (y_true, y_pred), 1)
    return cm


def scores(y_true, y_pred, num_classes: int) -> dict:
    """Accuracy, balanced accuracy, macro-F1 and the confusion matrix (as nested lists)."""
    cm = confusion_matrix(y_true, y_pred, num_classes)
    n = cm.sum()
    support = cm.sum(axis=1)
    predicted = cm.sum(axis=0)
    tp = np.diag(cm).astype(np.float64)
    present = support > 0
    recall = np.divide(tp, support, out=np.zeros_like(tp), where=present)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros_like(tp), where=denom > 0)
    used = present | (predicted > 0)
    return {
        "n": int(n),
        "accuracy": float(tp.sum() / n) if n else float("nan"),
        "balanced_accuracy": float(recall[present].mean()) if present.any() else float("nan"),
        "macro_f1": float(f1[used].mean()) if used.any() else float("nan"),
        "confusion": cm.tolist(),
    }


def per_group_accuracy(y_true, y_pred, groups, names) -> dict:
    """Accuracy within each group (task type), keyed by name; groups are indices into names."""
    y_true = np.asarray(y_true)
    y_pred = np.asarray(y_pred)
    groups = np.asarray(groups)
    out = {}
    for g, name in enumerate(names):
        m = groups == g
        if m.any():
            out[name] = float(np.mean(y_true[m] == y_pred[m]))
    return out


def report(y_true, y_pred, num_classes: int, groups, group_names) -> dict:
    """``scores`` plus ``per_task_accuracy``: the block printed for every model and baseline."""
    out = scores(y_true, y_pred, num_classes)
    out["per_task_accuracy"] = per_group_accuracy(y_true, y_pred, groups, group_names)
    return out
