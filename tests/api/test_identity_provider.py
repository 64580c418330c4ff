"""The identity provider's keys under attack and under failure, against a real JWKS server on loopback that
fails or hangs on command and counts its requests: a failed fetch starts a backoff (no amplification),
a hung refresh never stalls a request whose key is cached, the last good keys serve for a bounded grace
period, an unreachable provider is a 503 (never a 401), and a token cannot pick the wrong algorithm for
its key or use a short RSA key. Time is a test clock; nothing waits on the wall clock."""

from __future__ import annotations

import asyncio
import json
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from stepagent.api.auth import ApiAuthSettings, Unauthorized, Verifier
from stepagent.api.jwks import FAILURE_BACKOFF, GRACE_S, LIFESPAN_S, ProviderUnavailable
from stepagent.errors import ConfigurationError
from tests.api.helpers import AUDIENCE, ISSUER, Key, api_stack, ec_key, new_thread, rsa_key
from tests.console.helpers import scripted_model


@dataclass
class Provider:
    """A JWKS endpoint whose behaviour a test sets: ``ok``, ``fail`` (HTTP 500) or ``hang`` (until
    ``release`` is set). ``requests`` counts every request; ``hanging`` is set while one is held."""

    keys: list[Key]
    mode: str = "ok"
    url: str = ""
    requests: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    hanging: threading.Event = field(default_factory=threading.Event)


@contextmanager
def provider(keys: list[Key]) -> Iterator[Provider]:
    p = Provider(list(keys))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            p.requests += 1
            if p.mode == "hang":
                p.hanging.set()
                p.release.wait()
            if p.mode == "fail":
                body = b"upstream exploded: secret-internal-detail"
                self.send_response(500)
            else:
                body = json.dumps({"keys": [k.jwk() for k in p.keys]}).encode()
                self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    p.url = f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    try:
        yield p
    finally:
        p.release.set()
        server.shutdown()
        server.server_close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def verifier(url: str, *, timeout_s: float = 3.0) -> tuple[Verifier, Clock]:
    settings = ApiAuthSettings(
        mode="jwt",
        jwks_url=url,
        issuer=ISSUER,
        audience=AUDIENCE,
        jwks_refetch_s=10,
        jwks_timeout_s=timeout_s,
    )
    v = Verifier(settings)
    clock = Clock()
    assert v.jwks is not None
    v.jwks.clock = clock
    return v, clock


def bearer(token: str) -> str:
    return f"Bearer {token}"


async def test_a_failing_provider_is_asked_once_however_many_unknown_keys_are_presented() -> None:
    known = rsa_key("known")
    with provider([known]) as idp:
        v, clock = verifier(idp.url)
        assert await v.subject(bearer(known.token("alice"))) == "alice"
        assert idp.requests == 1
        idp.mode = "fail"
        clock.now += 11  # past the refetch cooldown: an unknown kid may cause one fetch
        strangers = [ec_key(f"kid-{n}") for n in range(30)]
        # 15 at once (they share one fetch), then 15 one after another (the failure's backoff holds them).
        results = await asyncio.gather(
            *(v.subject(bearer(k.token("mallory"))) for k in strangers[:15]), return_exceptions=True
        )
        for k in strangers[15:]:
            try:
                await v.subject(bearer(k.token("mallory")))
            except Exception as error:
                results.append(error)
        assert idp.requests == 2  # the first fetch and exactly one more
        assert all(isinstance(r, ProviderUnavailable) for r in results), results
        # The cached key still works meanwhile.
        assert await v.subject(bearer(known.token("alice"))) == "alice"
        # The backoff grows: the next try only after the first delay, the one after that twice as late.
        clock.now += FAILURE_BACKOFF.delay(1) - 1
        with pytest.raises(ProviderUnavailable):
            await v.subject(bearer(strangers[0].token("mallory")))
        assert idp.requests == 2
        clock.now += 1
        with pytest.raises(ProviderUnavailable):
            await v.subject(bearer(strangers[0].token("mallory")))
        assert idp.requests == 3
        clock.now += FAILURE_BACKOFF.delay(1)
        with pytest.raises(ProviderUnavailable):
            await v.subject(bearer(strangers[0].token("mallory")))
        assert idp.requests == 3  # the second failure doubled the wait
        # Recovered: a rotated key is found at the next allowed fetch.
        idp.mode = "ok"
        idp.keys.append(strangers[0])
        clock.now += FAILURE_BACKOFF.delay(2)
        assert await v.subject(bearer(strangers[0].token("mallory"))) == "mallory"
        assert idp.requests == 4
        await v.aclose()


async def test_a_hung_refresh_never_stalls_a_request_whose_key_is_cached() -> None:
    key = ec_key("es-1")
    with provider([key]) as idp:
        v, clock = verifier(idp.url)
        assert await v.subject(bearer(key.token("alice"))) == "alice"
        idp.mode = "hang"
        clock.now += LIFESPAN_S + 1  # stale: the next request refreshes in the background
        assert await v.subject(bearer(key.token("alice"))) == "alice"
        # The refresh reached the provider and is held there, and requests still pass, without a new fetch.
        assert await asyncio.to_thread(idp.hanging.wait, 10)
        for _ in range(5):
            assert await v.subject(bearer(key.token("bob"))) == "bob"
        assert idp.requests == 2
        idp.release.set()
        await v.aclose()


async def test_the_last_good_keys_serve_for_a_bounded_grace_period_then_503() -> None:
    key = rsa_key("rs-1")
    with provider([key]) as idp:
        v, clock = verifier(idp.url)
        assert await v.subject(bearer(key.token("alice"))) == "alice"
        idp.mode = "fail"
        clock.now += LIFESPAN_S + 1
        assert await v.subject(bearer(key.token("alice"))) == "alice"  # stale but within grace
        assert v.jwks is not None
        refresh = v.jwks._flight  # the background refresh this request started
        assert refresh is not None
        await refresh  # it fails (the provider answers 500); the stale keys stay
        clock.now += GRACE_S
        with pytest.raises(ProviderUnavailable) as unavailable:
            await v.subject(bearer(key.token("alice")))
        assert unavailable.value.retry_after >= 1
        await v.aclose()


async def test_a_hung_provider_with_nothing_cached_is_unavailable_not_unauthorized() -> None:
    key = ec_key("es-1")
    with provider([key]) as idp:
        idp.mode = "hang"
        v, _ = verifier(idp.url, timeout_s=0.2)
        with pytest.raises(ProviderUnavailable):
            await v.subject(bearer(key.token("alice")))
        assert idp.requests == 1
        await v.aclose()


def confused(signer: Key, alg: str, kid: str) -> str:
    """A token signed by ``signer`` with ``alg`` but naming the key ``kid`` (another type of key)."""
    claims = {"sub": "mallory", "iss": ISSUER, "aud": AUDIENCE, "exp": 4_000_000_000}
    return jwt.encode(claims, signer.private, algorithm=alg, headers={"kid": kid})


async def test_the_api_answers_503_for_a_down_provider_and_401_for_algorithm_confusion_and_short_keys() -> (
    None
):
    rs, es = rsa_key("rs-1"), ec_key("es-1")
    short = Key("rs-short", "RS256", rsa.generate_private_key(public_exponent=65537, key_size=1024))
    with provider([rs, es, short]) as idp:
        settings = ApiAuthSettings(
            mode="jwt",
            jwks_url=idp.url,
            issuer=ISSUER,
            audience=AUDIENCE,
            jwks_refetch_s=0,
            jwks_timeout_s=0.5,
        )
        async with api_stack(scripted_model(), settings) as api:
            path = f"/v1/threads/{new_thread('idp')}"
            assert (
                await api.http.get(path, headers={"Authorization": bearer(rs.token())})
            ).status_code == 404

            # An RS256 token naming the EC key, an ES256 token naming the RSA key: 401, not a 500.
            for token in (confused(rs, "RS256", "es-1"), confused(es, "ES256", "rs-1")):
                response = await api.http.get(path, headers={"Authorization": bearer(token)})
                assert response.status_code == 401, response.text
                assert response.json()["error"]["code"] == "unauthorized"

            # A 1024-bit RSA key in the JWKS is not accepted (RFC 7518 section 3.3).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", jwt.InsecureKeyLengthWarning)
                weak = short.token()
            response = await api.http.get(path, headers={"Authorization": bearer(weak)})
            assert response.status_code == 401, response.text

            # The provider down: 503 with Retry-After and a generic message, never 401.
            idp.mode = "fail"
            newcomer = ec_key("es-new")
            response = await api.http.get(path, headers={"Authorization": bearer(newcomer.token())})
            assert response.status_code == 503, response.text
            assert int(response.headers["Retry-After"]) >= 1
            error = response.json()["error"]
            assert error["code"] == "unavailable"
            assert "secret-internal-detail" not in response.text and "500" not in error["message"]
            # ... and hung: the same, after the short fetch timeout.
            idp.mode = "hang"
            api_verifier_cache = ec_key("es-newer")
            response = await api.http.get(path, headers={"Authorization": bearer(api_verifier_cache.token())})
            assert response.status_code == 503
            idp.release.set()


async def test_a_pem_key_binds_its_algorithm_and_must_be_long_enough() -> None:
    rs, es = rsa_key("rs-1"), ec_key("es-1")
    v = Verifier(ApiAuthSettings(mode="jwt", public_key=es.pem(), issuer=ISSUER, audience=AUDIENCE))
    assert await v.subject(bearer(es.token("alice"))) == "alice"
    with pytest.raises(Unauthorized):
        await v.subject(bearer(confused(rs, "RS256", "es-1")))
    v = Verifier(ApiAuthSettings(mode="jwt", public_key=rs.pem(), issuer=ISSUER, audience=AUDIENCE))
    with pytest.raises(Unauthorized):
        await v.subject(bearer(confused(es, "ES256", "rs-1")))
    short = Key("rs-short", "RS256", rsa.generate_private_key(public_exponent=65537, key_size=1024))
    with pytest.raises(ConfigurationError, match="2048"):
        Verifier(ApiAuthSettings(mode="jwt", public_key=short.pem(), issuer=ISSUER, audience=AUDIENCE))
