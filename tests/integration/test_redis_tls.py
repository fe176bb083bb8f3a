"""Redis over TLS (`rediss://`), against a real redis-server with a CA made in the test.

The server listens on TLS only (`--port 0`); clients find the CA through the URL
(`?ssl_ca_certs=/path/ca.pem`, the form the README documents). Passwords come from
`tests.secrets`, so a leak into any output is caught here and by `scripts/grep_secrets.sh`.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from millstream.embedded import HOST, EmbeddedService, _redis_server_bin, free_port
from millstream.errors import ConfigurationError, MillstreamError
from millstream.records import Production, TimeDomain
from millstream.settings import Settings, mask_url
from millstream.state.catalog import Verdict
from millstream.state.client import connect
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache
from millstream.state.watermarks import Watermark, WatermarkAuthority
from tests.secrets import MARKER, secret

TIMEOUT = 120


# ---------------------------------------------------------------- a CA and a server certificate


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def make_pki(folder: Path, name: str = "millstream-test") -> Pki:
    """A self-signed CA and a server certificate it signed, for 127.0.0.1 and localhost."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(ca=folder / "ca.pem", cert=folder / "server.pem", key=folder / "server-key.pem")
    pki.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(server_key, pki.key)
    return pki


# ---------------------------------------------------------------- a TLS-only redis-server


class TlsRedisService(EmbeddedService):
    """redis-server with TLS on `port` and no plaintext port; ready once a TLS PING answers."""

    name = "redis-tls"

    def __init__(self, argv: list[str], port: int, workdir: Path, pki: Pki) -> None:
        super().__init__(argv, port, workdir)
        self.pki = pki

    def url(self, password: str | None = None, *, ca: Path | None = None) -> str:
        auth = f":{password}@" if password else ""
        return f"rediss://{auth}{HOST}:{self.port}/0?ssl_ca_certs={ca or self.pki.ca}"

    def probe(self) -> bool:
        client = redis.Redis.from_url(self.url(), socket_timeout=1, socket_connect_timeout=1)
        try:
            return int(client.info("server")["process_id"]) == self.pid
        except (redis.RedisError, OSError, KeyError, ValueError):
            return False
        finally:
            client.close()


def start_tls_redis(folder: Path, pki: Pki) -> TlsRedisService:
    port = free_port()
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        _redis_server_bin(), "--port", "0", "--tls-port", str(port), "--bind", HOST,
        "--tls-cert-file", str(pki.cert), "--tls-key-file", str(pki.key),
        "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "no",
        "--save", "", "--appendonly", "no", "--dir", str(data), "--daemonize", "no",
    ]  # fmt: skip
    return TlsRedisService(argv, port, folder, pki).start()


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TlsRedisService, str]]:
    """A private TLS-only Redis whose default user needs a password (set over TLS after start)."""
    folder = tmp_path_factory.mktemp("redis-tls")
    service = start_tls_redis(folder / "server", make_pki(folder / "pki"))
    password = secret("redis-tls")
    try:
        admin = redis.Redis.from_url(service.url())
        try:
            admin.config_set("requirepass", password)
        finally:
            admin.close()
        yield service, password
    finally:
        service.stop()


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA that did not sign the server's certificate."""
    return make_pki(tmp_path_factory.mktemp("other-pki"), name="someone-else").ca


# ---------------------------------------------------------------- the state layer over TLS


def test_the_server_refuses_plaintext(tls_redis: tuple[TlsRedisService, str]) -> None:
    """Guards the other tests: what passes here went through TLS, never in the clear."""
    service, password = tls_redis
    plain = redis.Redis(host=HOST, port=service.port, password=password, socket_timeout=5)
    try:
        with pytest.raises(redis.ConnectionError):
            plain.ping()
    finally:
        plain.close()


def test_settings_accept_a_rediss_url_with_a_ca_and_mask_only_the_password(
    tls_redis: tuple[TlsRedisService, str],
) -> None:
    service, password = tls_redis
    url = service.url(password)
    settings = Settings.from_env({"REDIS_URL": url})
    assert settings.redis_url == url
    masked = mask_url(url)
    assert masked == f"rediss://:***@{HOST}:{service.port}/0?ssl_ca_certs={service.pki.ca}"
    assert password not in repr(settings) and str(service.pki.ca) in repr(settings)


def test_connect_shard_round_trip_and_watermarks_over_tls(
    tls_redis: tuple[TlsRedisService, str], redis_namespace: str
) -> None:
    service, password = tls_redis
    client = connect(service.url(password), cached=False)
    try:
        connection = client.connection_pool.get_connection()
        try:
            assert isinstance(connection, redis.SSLConnection)
            assert connection.cert_reqs == ssl.CERT_REQUIRED
        finally:
            client.connection_pool.release(connection)

        keys = ShardKeys(redis_namespace, "comp", 0)
        store = ShardStore(client, keys, ShardConfig(bucket_ms=60_000), SoftStateCache())
        store.acquire()
        assert store.dedup([(b"r1", 1, b"p1"), (b"r1", 1, b"p2")], 0) == [
            Verdict.NEW,
            Verdict.DUPLICATE,
        ]
        txn = store.begin()
        txn.set_state("k", b"1")
        txn.set_timer("k", "t", 5, TimeDomain.EVENT)
        txn.add_ids([(store.bucket_of(1), b"r1", b"p1")])
        txn.checkpoint(Production("out", "k", b"v", 5, b"pid", 1))
        store.commit(txn)
        assert client.hget(keys.state, "k") == b"1"

        again = ShardStore(client, keys, ShardConfig(bucket_ms=60_000), SoftStateCache())
        again.acquire()  # a new owner, new soft state: the catalog in Redis dedups r1
        assert again.dedup([(b"r1", 1, b"p9")], 0) == [Verdict.DUPLICATE]

        authority = WatermarkAuthority(client, redis_namespace)
        authority.publish("comp", Watermark(5, 7))
        authority.publish("comp", Watermark(3, 3))  # monotonic: never moves back
        assert authority.published("comp") == Watermark(5, 7)
    finally:
        client.close()


# ---------------------------------------------------------------- failures name the cause


def test_wrong_ca_is_a_configuration_error_naming_tls(
    tls_redis: tuple[TlsRedisService, str], other_ca: Path
) -> None:
    service, password = tls_redis
    url = service.url(password, ca=other_ca)
    with pytest.raises(ConfigurationError) as caught:
        connect(url, cached=False)
    message = str(caught.value)
    assert "TLS" in message and "certificate" in message, message
    assert "ssl_ca_certs" in message, message  # the fix
    assert f"{HOST}:{service.port}" in message, message
    assert password not in message and MARKER not in message, message


def test_missing_ca_file_is_a_configuration_error(
    tls_redis: tuple[TlsRedisService, str], tmp_path: Path
) -> None:
    service, password = tls_redis
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(ConfigurationError) as caught:
        connect(service.url(password, ca=missing), cached=False)
    message = str(caught.value)
    assert str(missing) in message and "ssl_ca_certs" in message, message
    assert MARKER not in message, message


def test_plaintext_url_to_a_tls_port_says_to_use_rediss(
    tls_redis: tuple[TlsRedisService, str],
) -> None:
    service, password = tls_redis
    with pytest.raises(MillstreamError) as caught:
        connect(f"redis://:{password}@{HOST}:{service.port}/0", cached=False)
    message = str(caught.value)
    assert "rediss://" in message, message
    assert MARKER not in message, message


def test_tls_url_to_a_plaintext_port_says_the_server_does_not_speak_tls(
    redis_url: str,
) -> None:
    if not redis_url.startswith("redis://"):
        pytest.skip(f"the session's Redis is not plaintext TCP ({mask_url(redis_url)})")
    # A short handshake timeout: redis-server waits for more bytes of the ClientHello.
    url = redis_url.replace("redis://", "rediss://", 1)
    url += ("&" if "?" in url else "?") + "socket_connect_timeout=1"
    with pytest.raises(ConfigurationError) as caught:
        connect(url, cached=False)
    message = str(caught.value)
    assert "TLS" in message and "redis://" in message, message


# ---------------------------------------------------------------- the CLI over TLS


def _millstream(
    args: list[str], env: Mapping[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("millstream")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "millstream.cli"]
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MILLSTREAM_") and k not in ("REDIS_URL", "KAFKA_BOOTSTRAP_SERVERS")
    }
    return subprocess.run(
        [*command, *args],
        env={**clean, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_status_cli_over_tls(
    tls_redis: tuple[TlsRedisService, str], redis_namespace: str, tmp_path: Path
) -> None:
    service, password = tls_redis
    client = connect(service.url(password), cached=False)
    try:
        WatermarkAuthority(client, redis_namespace).publish("comp", Watermark(5, 7))
    finally:
        client.close()
    env = {"REDIS_URL": service.url(password), "MILLSTREAM_APP": redis_namespace}
    result = _millstream(["status", "--json"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    assert snapshot["app"] == redis_namespace
    assert MARKER not in result.stdout + result.stderr


def test_status_cli_with_a_wrong_ca_is_one_line_without_the_password(
    tls_redis: tuple[TlsRedisService, str], other_ca: Path, tmp_path: Path
) -> None:
    service, password = tls_redis
    env = {"REDIS_URL": service.url(password, ca=other_ca)}
    result = _millstream(["status"], env, tmp_path)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("millstream: error: "), result.stderr
    assert "certificate" in result.stderr and "ssl_ca_certs" in result.stderr, result.stderr
    assert f"rediss://:***@{HOST}:{service.port}" in result.stderr, result.stderr
    assert MARKER not in result.stdout + result.stderr
