"""Watching a cold child's process for the clients it creates (:mod:`bench.cold_child`, after its timed
import): every botocore client and httpx client, also modules imported only later."""

from __future__ import annotations

import gc
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType


def service_of(client: object) -> str:
    return str(getattr(client, "meta").service_model.service_name)  # noqa: B009 - botocore is untyped


def aws_clients() -> list[str]:
    """The services of the botocore clients alive now; none when botocore
    was never imported."""
    client = sys.modules.get("botocore.client")
    if client is None:
        return []
    return sorted(service_of(o) for o in gc.get_objects() if isinstance(o, client.BaseClient))


def when_imported(name: str, patch: Callable[[ModuleType], None]) -> None:
    """Run ``patch`` on module ``name``: now if it is loaded, else as soon as something imports it (the
    worker imports httpx only when its provider needs it)."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        patch(loaded)
        return

    class PatchOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: object, target: object = None) -> ModuleSpec | None:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_patch(module: ModuleType) -> None:
                exec_module(module)
                patch(module)

            spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, PatchOnImport())


def record_created(created: dict[str, list[str]]) -> None:
    """From now on, note every botocore client (its service) and every httpx client created in
    ``created`` — also those closed again by the time a call returns."""

    def watch_botocore(botocore_client: ModuleType) -> None:
        init = botocore_client.BaseClient.__init__

        def noting_init(self: object, *args: object, **kwargs: object) -> None:
            init(self, *args, **kwargs)
            created["aws"].append(service_of(self))

        botocore_client.BaseClient.__init__ = noting_init

    def watch_httpx(httpx: ModuleType) -> None:
        http_init = httpx.AsyncClient.__init__

        def noting_http_init(self: object, *args: object, **kwargs: object) -> None:
            http_init(self, *args, **kwargs)
            created["http"].append("httpx.AsyncClient")

        httpx.AsyncClient.__init__ = noting_http_init

    when_imported("botocore.client", watch_botocore)
    when_imported("httpx", watch_httpx)
