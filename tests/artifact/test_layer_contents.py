"""The layer's pruned botocore keeps the model of every AWS service the runtime calls."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_service_the_runtime_calls_keeps_its_botocore_model() -> None:
    spec = importlib.util.spec_from_file_location("build_layer", ROOT / "infra" / "build_layer.py")
    assert spec is not None and spec.loader is not None
    build_layer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_layer)
    source = "\n".join(p.read_text() for p in (ROOT / "src" / "stepagent").rglob("*.py"))
    called = set(re.findall(r'client\([^"\n]*?"([a-z0-9-]+)"', source))
    assert {
        "dynamodb",
        "sqs",
        "s3",
        "scheduler",
        "secretsmanager",
        "ssm",
        "bedrock-runtime",
        "cloudformation",
    } <= called
    assert called <= set(build_layer.RUNTIME_AWS_SERVICES), called - set(build_layer.RUNTIME_AWS_SERVICES)
