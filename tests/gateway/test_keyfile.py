"""The keys file: the plain list still reads as before; a TOML file gives each key its webhook and
its tenant, with the tenant's limits; a file that is wrong stops the gateway saying where."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.auth import ApiKeys, AuthNotConfigured, key_tenant, owner_id
from shared.config import GatewaySettings
from shared.tenants import Tenant
from tests.gateway.webhooks.receiver import new_secret

SECRET = new_secret()


def keys_of(path: Path) -> ApiKeys:
    return ApiKeys.from_settings(GatewaySettings(api_keys="key-0", api_keys_file=path))


def test_a_plain_file_is_one_key_per_line(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("\nkey-1\n  key-2 \n")
    api_keys = keys_of(path)
    assert len(api_keys.digests) == 3 and api_keys.webhooks == {}
    assert api_keys.owner("key-2") == owner_id("key-2")


def test_a_toml_file_gives_keys_their_webhook(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(
        f'[[keys]]\nkey = "key-1"\nwebhook_secret = "{SECRET}"\nwebhook_url = "https://hooks.example.com/a"\n'
        '[[keys]]\nkey = "key-2"\n'
    )
    api_keys = keys_of(path)
    assert len(api_keys.digests) == 3
    assert set(api_keys.webhooks) == {owner_id("key-1")}
    assert api_keys.webhooks[owner_id("key-1")].default_url == "https://hooks.example.com/a"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[[keys]]\nkey = "k"\nwebhook_url = "https://hooks.example.com/"\n', "needs a webhook_secret"),
        ('[[keys]]\nkey = "k"\nwebhook_secret = "plain"\n', "whsec_"),
        ('[[keys]]\nkey = "k"\nsecret = "x"\n', "keys.0.secret"),
        ("[[keys]\n", "not valid TOML"),
        (
            '[[keys]]\nkey = "k"\ntenant = "nobody"\n',
            "keys.0.tenant: no \\[\\[tenants\\]\\] table is named 'nobody'",
        ),
        ('[[tenants]]\nname = "a"\n[[tenants]]\nname = "a"\n', "declared twice"),
        ('[[tenants]]\nname = "a b"\n', "tenants.0.name"),
        ('[[tenants]]\nname = "a"\nmax_queued_jobs = 0\n', "tenants.0.max_queued_jobs"),
        ('[[tenants]]\nname = "a"\ntokens_per_minute = "many"\n', "tenants.0.tokens_per_minute"),
        ('[[tenants]]\nname = "a"\nweight = 0\n', "tenants.0.weight"),
        (
            '[[tenants]]\nname = "a"\nmin_priority = 0\ndefault_priority = -3\n',
            "default_priority must be at least min_pri",
        ),
        ('[[tenants]]\nname = "a"\nmin_priority = -2000000\n', "tenants.0.min_priority"),
        ('[[tenants]]\nname = "a"\nrequests_per_hour = 3\n', "tenants.0.requests_per_hour"),
    ],
)
def test_a_wrong_toml_file_stops_the_gateway_saying_where(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(text)
    with pytest.raises(AuthNotConfigured, match=says):
        keys_of(path)


def test_keys_share_a_tenant_and_its_limits_and_a_key_without_one_is_its_own(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(
        '[[tenants]]\nname = "team-a"\nmax_queued_jobs = 10\nmax_running_jobs = 4\nrequests_per_minute = 60\n'
        "tokens_per_minute = 9000\nweight = 2\ndefault_priority = 1\nmin_priority = -5\n"
        '[[keys]]\nkey = "key-1"\ntenant = "team-a"\n'
        '[[keys]]\nkey = "key-2"\ntenant = "team-a"\n'
        '[[keys]]\nkey = "key-3"\n'
        '[[keys]]\nkey = "key-4"\ntenant = "default"\n'
    )
    api_keys = keys_of(path)
    team_a = Tenant("team-a", 10, 4, 60, 9000, weight=2.0, default_priority=1, min_priority=-5)
    assert api_keys.tenants == {
        owner_id("key-0"): Tenant(key_tenant("key-0")),
        owner_id("key-1"): team_a,
        owner_id("key-2"): team_a,
        owner_id("key-3"): Tenant(key_tenant("key-3")),
        owner_id("key-4"): Tenant("default"),
    }
    assert key_tenant("key-0") != key_tenant("key-3") and key_tenant("key-0").startswith("key-")
    assert list(team_a.script_limits().values()) == [10, 4, 60, 9000]
    assert list(Tenant("default").script_limits().values()) == [0, 0, 0, 0]


def test_the_default_tables_limits_are_each_tenantless_keys(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text('[[tenants]]\nname = "default"\nmax_queued_jobs = 2\n[[keys]]\nkey = "key-1"\n')
    tenants = keys_of(path).tenants
    assert tenants[owner_id("key-1")] == Tenant(key_tenant("key-1"), max_queued_jobs=2)
    assert tenants[owner_id("key-0")] == Tenant(key_tenant("key-0"), max_queued_jobs=2)


def test_a_plain_files_keys_are_each_a_tenant_without_limits(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("key-1\n")
    assert set(keys_of(path).tenants.values()) == {Tenant(key_tenant("key-0")), Tenant(key_tenant("key-1"))}
