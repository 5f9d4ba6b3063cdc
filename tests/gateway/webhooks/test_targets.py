"""Which webhook a job may have: only under an allowed prefix, compared as URLs (never as loose
strings), with a key that can sign it; a key's default outside the prefixes stops the gateway."""

from __future__ import annotations

import pytest

from gateway.webhooks.signing import KeyWebhook, WebhookSecret
from gateway.webhooks.targets import WebhooksMisconfigured, WebhookTargets, normalized_path
from shared.errors import WebhookRefused
from shared.events import JobState
from shared.tenants import Tenant
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


@pytest.mark.parametrize(
    ("path", "resolved"),
    [
        ("/tenant-a/%2e%2e/tenant-b/x", "/tenant-b/x"),
        ("/tenant-a/%2E%2e/%2e/tenant-b/", "/tenant-b/"),
        ("/a/./b/../c", "/a/c"),
        ("/a/b/%2e", "/a/b/"),
        ("/a/b/..", "/a/"),
        ("/../../a", "/a"),
        ("/%7euser/%41%62%2D%5f/%3f%c3%a9", "/~user/Ab-_/%3F%C3%A9"),  # only unreserved are decoded
        ("/a?next=%2e%2e/b", "/a?next=%2e%2e/b"),  # the query is no path
        ("", "/"),
    ],
)
def test_a_path_is_compared_as_a_receiver_resolves_it(path: str, resolved: str) -> None:
    assert normalized_path(path) == resolved


@pytest.mark.parametrize("path", ["/a/%2f../b", "/a/%2F", "/a/%5c..%5cb", "/a\\..\\b", "/a/%zz", "/a/%2"])
def test_a_path_with_an_encoded_slash_a_backslash_or_a_stray_percent_is_refused(path: str) -> None:
    with pytest.raises(ValueError):
        normalized_path(path)


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/tenant-a/%2e%2e/tenant-b/x",
        "https://hooks.example.com/tenant-a/%2e%2e%2ftenant-b/x",
        "https://hooks.example.com/tenant-a/..%5ctenant-b",
        "https://hooks.example.com/tenant-a/../tenant-b/x",
    ],
)
def test_dot_segments_do_not_escape_a_prefix(url: str) -> None:
    targets = WebhookTargets(["https://hooks.example.com/tenant-a/"], {"owner-1": SIGNER})
    with pytest.raises(WebhookRefused):
        targets.annotations("owner-1", url, "job")


def test_a_tenants_own_prefixes_replace_the_gateways() -> None:
    own = Tenant("team-a", webhook_allowed_prefixes=("https://hooks.example.com/team-a/",))
    none = Tenant("team-b", webhook_allowed_prefixes=())
    targets = WebhookTargets(
        ["https://hooks.example.com/shared/"],
        {"owner-a": SIGNER, "owner-b": SIGNER, "owner-c": SIGNER},
        {"owner-a": own, "owner-b": none, "owner-c": Tenant("default")},
    )
    url = "https://hooks.example.com/team-a/%7ejobs"
    assert (
        targets.annotations("owner-a", url, "job")["webhook_url"] == "https://hooks.example.com/team-a/~jobs"
    )
    with pytest.raises(WebhookRefused, match="webhook_allowed_prefixes"):
        targets.annotations("owner-a", "https://hooks.example.com/shared/", "job")
    with pytest.raises(WebhookRefused, match="not enabled"):
        targets.annotations("owner-b", "https://hooks.example.com/shared/", "job")
    with pytest.raises(WebhookRefused):
        targets.annotations("owner-c", url, "job")
    assert targets.annotations("owner-c", "https://hooks.example.com/shared/x", "job")
    default_elsewhere = {"owner-a": KeyWebhook(SIGNER.secret, "https://hooks.example.com/shared/")}
    with pytest.raises(WebhooksMisconfigured):
        WebhookTargets(["https://hooks.example.com/shared/"], default_elsewhere, {"owner-a": own})


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
    assert event_type("job", JobState.completed.value, "length") == "job.completed"
    assert event_type("job", JobState.cancelled.value, None) == "job.cancelled"
    assert event_type("response", JobState.completed.value, "length") == "response.incomplete"
    assert event_type("response", JobState.completed.value, "stop") == "response.completed"
    assert event_type("response", JobState.failed.value, None) == "response.failed"
    assert subject_id("response", "ab12") == "resp_ab12" and subject_id("job", "ab12") == "ab12"


@pytest.mark.parametrize("text", ["secret", "whsec_not*base64", "whsec_c2hvcnQ="])
def test_a_secret_that_is_not_whsec_base64_of_enough_bytes_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="webhook secret"):
        WebhookSecret.parse(text)
    assert text not in repr(WebhookSecret.parse(new_secret()))
