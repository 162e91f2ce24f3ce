"""Broker URLs: what the invite carries and what `--mqtt-url` accepts, with clear errors."""

import ssl

import pytest

from potluck.telemetry.config import MqttTarget
from potluck.telemetry.errors import TelemetryError


def test_urls_parse_with_defaults_credentials_and_tls():
    plain = MqttTarget.parse("mqtt://127.0.0.1")
    assert (plain.host, plain.port, plain.tls, plain.username) == ("127.0.0.1", 1883, False, None)
    assert plain.tls_context() is None
    secure = MqttTarget.parse("mqtts://pot%40luck:s3cr%3At@broker.example.org")
    assert (secure.port, secure.tls, secure.username, secure.password) == (8883, True, "pot@luck", "s3cr:t")
    assert isinstance(secure.tls_context(), ssl.SSLContext)
    assert MqttTarget.parse(secure.url()) == secure  # what the invite carries reads back the same
    assert "s3cr" not in secure.url(with_password=False)  # what logs and screens show
    assert MqttTarget.parse("mqtt://[::1]:1884").url() == "mqtt://[::1]:1884"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:1883", "use mqtt://"),
        ("mqtt://", "use mqtt://"),
        ("mqtt://host:99999", "Port out of range"),
        ("mqtt://host:1883/path", "no path"),
        ("mqtt://" + "a" * 600, "characters"),
    ],
)
def test_bad_urls_get_a_clear_error(url, why):
    with pytest.raises(TelemetryError, match=why):
        MqttTarget.parse(url)
