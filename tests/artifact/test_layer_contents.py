"""The layer's pruned botocore keeps the model of every AWS service the runtime calls."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
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
        "kms",
        "sqs",
        "s3",
        "scheduler",
        "secretsmanager",
        "ssm",
        "bedrock-runtime",
        "cloudformation",
    } <= called
    assert called <= set(build_layer.RUNTIME_AWS_SERVICES), called - set(build_layer.RUNTIME_AWS_SERVICES)


def test_the_handlers_and_every_aws_module_load_without_the_type_stubs() -> None:
    """The types-aiobotocore stubs are a development dependency (the layer does not ship them): every
    module that names their types imports them under ``TYPE_CHECKING`` only."""
    modules = [
        "handlers.worker",
        "handlers.tool_runner",
        "handlers.timer_relay",
        "handlers.rap_receiver",
        "handlers.api",
        *sorted(
            "stepagent." + ".".join(p.relative_to(ROOT / "src" / "stepagent").with_suffix("").parts)
            for folder in ("stores", "senders", "aws")
            for p in (ROOT / "src" / "stepagent" / folder).rglob("*.py")
            if p.name != "__init__.py"
        ),
        "stepagent.blobs",
        "stepagent.client.watch",
    ]
    script = (
        "import importlib, importlib.abc, sys\n"
        "class NoStubs(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0].startswith(('types_aiobotocore', 'mypy_boto3')):\n"
        "            raise ImportError(f'{name} is a development-only type stub')\n"
        "        return None\n"
        "sys.meta_path.insert(0, NoStubs())\n"
        f"for module in {modules!r}:\n"
        "    importlib.import_module(module)\n"
        "print(len([m for m in sys.modules if m.startswith('stepagent.stores.dynamodb.')]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) == 10  # the whole DynamoDB package was imported
