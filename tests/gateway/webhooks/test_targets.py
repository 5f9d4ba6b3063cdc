"""Which webhook a job may have: only under an allowed prefix, compared as URLs (never as loose
strings), with a key that can sign it; a key's default outside the prefixes stops the gateway."""

from __future__ import annotations

import pytest

from gateway.webhooks.signing import KeyWebhook, WebhookSecret
from gateway.webhooks.targets import WebhooksMisconfigured, WebhookTargets
from shared.errors import WebhookRefused
from shared.events import JobState
from shared.webhooks import event_type, subject_id
from tests.gateway.webhooks.receiver import new_secret

SIGNER = KeyWebhook(WebhookSecret.parse(new_secret()))
TARGETS = WebhookTargets(["https://hooks.example.com"], {"owner-1": SIGNER})


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com.evil.net/",  # the prefix's host is a prefix of another host
        "https://hooks.example.com:8443/x",
        "http://hooks.example.com/x",
        "https://other.example.com/?next=https://hooks.example.com/",
        "not a url",
    ],
)
def test_a_url_not_under_an_allowed_prefix_is_refused_naming_the_field(url: str) -> None:
    with pytest.raises(WebhookRefused) as refused:
        TARGETS.annotations("owner-1", url, "job", field="hook")
    assert refused.value.field == "hook" and refused.value.message.startswith("hook: ")


def test_a_url_under_a_prefix_is_kept_normalized_with_its_api() -> None:
    assert TARGETS.annotations("owner-1", "https://HOOKS.example.com", "response") == {
        "webhook_url": "https://hooks.example.com/",
        "api": "response",
    }
    assert TARGETS.annotations("owner-1", None, "job") == {}  # no default: no webhook


def test_no_allowed_prefix_refuses_every_webhook() -> None:
    with pytest.raises(WebhookRefused, match="not enabled"):
        WebhookTargets([], {"owner-1": SIGNER}).annotations("owner-1", "https://hooks.example.com/", "job")


def test_a_keys_default_outside_the_prefixes_stops_the_gateway() -> None:
    outside = KeyWebhook(SIGNER.secret, "https://elsewhere.example.com/")
    with pytest.raises(WebhooksMisconfigured, match="elsewhere"):
        WebhookTargets(["https://hooks.example.com/"], {"owner-1": outside})
    with pytest.raises(WebhooksMisconfigured, match="prefix"):
        WebhookTargets(["hooks.example.com"], {})


def test_event_types_follow_openais_names() -> None:
    assert event_type("job", JobState.completed, "length") == "job.completed"
    assert event_type("job", JobState.cancelled, None) == "job.cancelled"
    assert event_type("response", JobState.completed, "length") == "response.incomplete"
    assert event_type("response", JobState.completed, "stop") == "response.completed"
    assert event_type("response", JobState.failed, None) == "response.failed"
    assert subject_id("response", "ab12") == "resp_ab12" and subject_id("job", "ab12") == "ab12"


@pytest.mark.parametrize("text", ["secret", "whsec_not*base64", "whsec_c2hvcnQ="])
def test_a_secret_that_is_not_whsec_base64_of_enough_bytes_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="webhook secret"):
        WebhookSecret.parse(text)
    assert text not in repr(WebhookSecret.parse(new_secret()))
