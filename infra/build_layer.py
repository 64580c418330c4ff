"""Build the Lambda layer: stepagent, its pinned dependencies and (optionally) the user's tools project.

Called by ``make build-RuntimeLayer``, which is what ``sam build`` runs for ``RuntimeLayer``
(``BuildMethod: makefile``) and what the artifact test in ``tests/artifact`` runs into a temporary folder.
Standard library only, so it runs under any Python 3.11 or later; run it on the target runtime's Python
(3.13) so the ``.pyc`` files it keeps are the ones Lambda loads.

What it guarantees:

- The layer holds exactly what the four handlers need at run time: the ``stepagent`` wheel (built from
  this checkout), its runtime dependencies resolved against ``constraints.txt``, and, with ``--tools``, the
  user's project and its own dependencies (resolved together with ours, so a conflict fails the build,
  not the first invocation). Nothing development-only (moto, pytest, linters, benchmarks) is installed.
- Wheels are the ones pip resolves for the Lambda runtime ``python3.13`` (Amazon Linux 2023, glibc 2.34:
  manylinux2014 or manylinux_2_28 wheels for CPython 3.13 and the chosen architecture), so no container is
  needed. ``.pyc`` files are kept when the build runs on Python 3.13 (compiling at cold start is billed);
  on another interpreter they would be compiled for the wrong version, so none are written and a notice
  says so.
- botocore's service models are pruned to the services the runtime calls (plus ``--aws-services`` for the
  user's tools, or ``all`` to keep every model): that is most of the layer's weight.
- ``python/stepagent_layer.json`` records the architecture and Python version the layer was built for;
  the handlers refuse to start on a mismatch with one clear message instead of failing on a native import.
- The unzipped size is printed and the build fails above Lambda's 250 MB limit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The Lambda runtime (template.yaml: Runtime python3.13) runs Amazon Linux 2023, glibc 2.34: wheels tagged
# for manylinux2014 (glibc 2.17) and manylinux_2_28 both load there; pip picks the best one per package.
PLATFORMS = {
    "x86_64": ("manylinux2014_x86_64", "manylinux_2_28_x86_64"),
    "arm64": ("manylinux2014_aarch64", "manylinux_2_28_aarch64"),
}
PYTHON_VERSION = "3.13"
LAMBDA_UNZIPPED_LIMIT = 250 * 1024 * 1024

# Every AWS service the runtime creates a client for (tests/artifact checks this list against the code),
# plus STS (credential resolution).
RUNTIME_AWS_SERVICES = (
    "bedrock-runtime",
    "cloudformation",
    "dynamodb",
    "kms",
    "s3",
    "scheduler",
    "secretsmanager",
    "sqs",
    "ssm",
    "sts",
)


def say(message: str) -> None:
    print(f"layer: {message}", flush=True)


def run(command: list[str]) -> None:
    subprocess.run(command, check=True)


def pip(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *arguments]


def build_wheel(project: Path, into: Path) -> None:
    # Build from a copy: pip builds in the tree otherwise and leaves build/ and *.egg-info behind.
    with tempfile.TemporaryDirectory(prefix="stepagent-layer-src-") as scratch:
        source = Path(scratch) / project.name
        ignore = shutil.ignore_patterns(
            ".git", ".venv*", ".aws-sam", "__pycache__", "*.egg-info", "build", "dist", ".*_cache", "tests"
        )
        shutil.copytree(project, source, ignore=ignore)
        run(pip("wheel", "--no-deps", "-w", str(into), str(source)))


def tools_requirements(tools: Path, wheels: Path, target: Path) -> list[str]:
    """What to install for the user's tools project: its wheel (a pyproject.toml or setup.py project),
    or its requirements.txt with its top-level modules and packages copied as they are."""
    if (tools / "pyproject.toml").exists() or (tools / "setup.py").exists():
        say(f"building the tools project {tools}")
        build_wheel(tools, wheels)
        return []
    requirements = tools / "requirements.txt"
    say(f"copying the tools in {tools} (no pyproject.toml: modules and packages as they are)")
    for entry in sorted(tools.iterdir()):
        if entry.name.startswith((".", "_")) or entry.name in {"tests", "requirements.txt"}:
            continue
        if entry.is_dir() and (entry / "__init__.py").exists():
            shutil.copytree(entry, target / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        elif entry.suffix == ".py":
            shutil.copy2(entry, target / entry.name)
    return ["-r", str(requirements)] if requirements.exists() else []


def prune_botocore(target: Path, keep: set[str]) -> int:
    """Remove the models of services nobody calls; returns the bytes freed."""
    data = target / "botocore" / "data"
    freed = 0
    if not data.is_dir():
        return 0
    for service in data.iterdir():
        if service.is_dir() and service.name not in keep:
            freed += tree_size(service)
            shutil.rmtree(service)
    return freed


def tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def build(target: Path, architecture: str, tools: Path | None, aws_services: list[str]) -> int:
    started = time.monotonic()
    platforms = PLATFORMS[architecture]
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    compile_flag = [] if running == PYTHON_VERSION else ["--no-compile"]
    if compile_flag:
        say(
            f"building on Python {running}, not {PYTHON_VERSION}: no .pyc files are kept (they would not match "
            f"the runtime); run the build with python{PYTHON_VERSION} for faster cold starts"
        )
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stepagent-layer-wheels-") as scratch:
        wheels = Path(scratch)
        say("building the stepagent wheel")
        build_wheel(ROOT, wheels)
        extra = tools_requirements(tools, wheels, target) if tools is not None else []
        say(f"installing the pinned runtime dependencies for {'/'.join(platforms)}, CPython {PYTHON_VERSION}")
        run(
            pip(
                "install",
                "--target",
                str(target),
                "-c",
                str(ROOT / "constraints.txt"),
                *[flag for platform in platforms for flag in ("--platform", platform)],
                "--implementation",
                "cp",
                "--python-version",
                PYTHON_VERSION,
                "--only-binary=:all:",
                "--upgrade",
                *compile_flag,
                *[str(w) for w in sorted(wheels.glob("*.whl"))],
                *extra,
            )
        )
    # Console scripts of the dependencies are not callable from a layer.
    shutil.rmtree(target / "bin", ignore_errors=True)
    if "all" not in aws_services:
        keep = set(RUNTIME_AWS_SERVICES) | set(aws_services)
        freed = prune_botocore(target, keep)
        say(f"pruned botocore models to {len(keep)} services ({freed / 1e6:.1f} MB freed)")
    (target / "stepagent_layer.json").write_text(
        json.dumps({"architecture": architecture, "python": PYTHON_VERSION}, indent=2) + "\n"
    )
    size = tree_size(target)
    say(
        f"{size / 2**20:.1f} MiB unzipped in {target} ({time.monotonic() - started:.0f} s; "
        f"Lambda's limit is {LAMBDA_UNZIPPED_LIMIT / 2**20:.0f} MiB for code and layers together)"
    )
    if size > LAMBDA_UNZIPPED_LIMIT:
        print(f"layer: too big for Lambda ({size / 2**20:.1f} MiB)", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts-dir", required=True, help="the layer root (sam build's ARTIFACTS_DIR)")
    parser.add_argument("--architecture", default="x86_64", choices=sorted(PLATFORMS))
    parser.add_argument("--tools", default="", help="your tools project directory (optional)")
    parser.add_argument(
        "--aws-services",
        default="",
        help="extra botocore models your tools need (space or comma separated), or 'all'",
    )
    args = parser.parse_args()
    target = Path(args.artifacts_dir) / "python"
    if target.exists():
        shutil.rmtree(target)
    tools = Path(args.tools).expanduser().resolve() if args.tools.strip() else None
    if tools is not None and not tools.is_dir():
        print(f"layer: TOOLS_DIR={args.tools} is not a directory", file=sys.stderr)
        return 2
    services = [s for s in args.aws_services.replace(",", " ").split() if s]
    os.environ.setdefault("PIP_NO_INPUT", "1")
    return build(target, args.architecture, tools, services)


if __name__ == "__main__":
    sys.exit(main())
