"""``fraud``: a pipeline from a transaction and a user id to approve / review / decline.

Steps (``platform: ensemble`` in a Triton ``config.pbtxt``, with milliserve's step fields):

1. ``features``: the user's 60 profile features from ``users.csv`` (in-process; the same
   config reads Redis hashes with ``source { redis_prefix: ... }``), defaults for unknown users;
2. ``python``: :func:`join_features`, the transaction's 4 features then the user's 60;
3. ``fraud_mlp``: the example MLP (its feature columns 0-3 are the transaction, 4-63 the user);
4. ``rules``: fraud probability >= 0.9 declines, >= 0.5 sends to review, else approve.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from milliserve.examples.fraud_mlp import FEATURES

__all__ = [
    "TRANSACTION",
    "USER_FEATURES",
    "build_fraud",
    "join_features",
    "user_table",
]

TRANSACTION = ("amount", "velocity", "new_device", "geo_distance")  # standardised
_NAMED = ("chargebacks_90d", "account_age", "failed_logins_24h", "country_risk")
USER_FEATURES = (*_NAMED, *(f"profile_{i:02d}" for i in range(FEATURES - len(TRANSACTION) - len(_NAMED))))
USERS = 1000


def join_features(inputs: dict[str, np.ndarray[Any, Any]], parameters: dict[str, str]) -> dict[str, Any]:
    """The custom step: ``features`` = [transaction | user_features], FP32 [batch, 64]."""
    joined = np.concatenate([inputs["transaction"], inputs["user_features"]], axis=1)
    return {"features": joined.astype(np.float32, copy=False)}


def user_table(n: int = USERS, seed: int = 1) -> tuple[list[str], np.ndarray[Any, Any]]:
    """User ids ``u0000``... and their standardised profile features."""
    rng = np.random.default_rng(seed)
    return [f"u{i:04d}" for i in range(n)], rng.normal(size=(n, len(USER_FEATURES))).astype(np.float32)


def _pbtxt() -> str:
    names = ", ".join(f'"{n}"' for n in USER_FEATURES)
    return f"""\
# The fraud pipeline: Triton's ensemble layout, plus milliserve's step fields
# (features, python, rules) and latency budget.
name: "fraud"
platform: "ensemble"
max_batch_size: 64
input [
  {{ name: "user_id" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "transaction" data_type: TYPE_FP32 dims: [ {len(TRANSACTION)} ] }}
]
output [
  {{ name: "decision" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "fraud_score" data_type: TYPE_FP32 dims: [ 1 ] }}
]
budget {{
  p99_ms: 50
  stages [
    {{ key: "parse" value: 3 }}, {{ key: "features" value: 5 }}, {{ key: "preprocess" value: 2 }},
    {{ key: "queue" value: 10 }}, {{ key: "infer" value: 20 }}, {{ key: "postprocess" value: 2 }},
    {{ key: "serialize" value: 3 }}
  ]
}}
ensemble_scheduling {{
  step [
    {{
      features {{
        input: "user_features"
        names: [ {names} ]
        entity_input: "user_id"
        source {{ table: "users.csv" key: "user_id" }}
      }}
    }},
    {{
      python {{
        function: "milliserve.examples.fraud:join_features"
        inputs: [ "transaction", "user_features" ]
        outputs: [ "features" ]
      }}
    }},
    {{
      model_name: "fraud_mlp"
      model_version: -1
      input_map {{ key: "features" value: "features" }}
      output_map {{ key: "probabilities" value: "probabilities" }}
    }},
    {{
      rules {{
        input: "probabilities"
        column: 1
        thresholds [ {{ at_least: 0.9 label: "decline" }}, {{ at_least: 0.5 label: "review" }} ]
        default: "approve"
        output: "decision"
        score_output: "fraud_score"
      }}
    }}
  ]
}}
"""


def build_fraud(repo: Path) -> Path:
    """Write ``repo/fraud/{config.pbtxt, users.csv, 1/}``; needs ``fraud_mlp`` beside it."""
    model_dir = repo / "fraud"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    ids, rows = user_table()
    with (model_dir / "users.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(("user_id", *USER_FEATURES))
        for uid, row in zip(ids, rows, strict=True):
            w.writerow((uid, *(f"{v:.5f}" for v in row)))
    (model_dir / "config.pbtxt").write_text(_pbtxt(), encoding="utf-8")
    return model_dir
