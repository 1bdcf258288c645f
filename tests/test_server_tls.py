"""The server's process reuses httpx's default TLS context (``envs.tls``): agent_env makes an httpx client for
every request, an open episode's poll among them, and each used to parse the CA bundle again. Verification is
unchanged: a loopback HTTPS server whose certificate no CA signed is still refused."""

import datetime
import http.server
import ssl
import threading

import httpx
import pytest

from agentenv_nb.envs import tls


@pytest.fixture(scope="module")
def https_url(tmp_path_factory):
    """A loopback HTTPS server with a self-signed certificate; yields its URL and the certificate's file."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
                   .sign(key, hashes.SHA256()))
    folder = tmp_path_factory.mktemp("tls")
    (folder / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://localhost:{server.server_address[1]}/", folder / "cert.pem"
    server.shutdown()


def test_serving_makes_default_clients_share_one_context(tmp_path):
    from agentenv_nb.envs.serve.thread import serve_in_thread
    from agentenv_nb.tasks.gridsim import write_bundle

    with serve_in_thread(write_bundle(tmp_path / "gridsim", train=1, eval=1), sandbox="process"):
        clients = [httpx.AsyncClient(), httpx.AsyncClient(), httpx.Client()]  # alive, so no id is reused
        contexts = {id(client._transport._pool._ssl_context) for client in clients}
    assert len(contexts) == 1, "each httpx client of the server's process built its own TLS context"


def test_the_shared_context_still_refuses_an_unknown_certificate(https_url):
    url, certificate = https_url
    tls.share_default_context()
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(url)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):  # the second client: the cached one
        httpx.get(url)
    assert httpx.get(url, verify=ssl.create_default_context(cafile=certificate)).status_code == 200
    assert httpx.get(url, verify=False).status_code == 200  # a client's own choice stays its own


def test_changed_ca_settings_get_a_context_of_their_own(https_url, monkeypatch):
    url, certificate = https_url
    tls.share_default_context()
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate))  # httpx reads it for default clients (trust_env)
    assert httpx.get(url).status_code == 200
    monkeypatch.delenv("SSL_CERT_FILE")
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(url)

