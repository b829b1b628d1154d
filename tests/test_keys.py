"""Key naming: companions share the active key's slot, checked against a real Cluster's CLUSTER KEYSLOT."""

from __future__ import annotations

import pytest

from bloomctl.errors import UsageError
from bloomctl.keys import KeyFamily, crc16, hash_tag, key_slot

AWKWARD = [
    "users",
    "bf:{users}",
    "{}",
    "{",
    "}",
    "}{",
    "{}{users}",
    "{{users}}",
    "a{b{c}d}e",
    "{a}{b}",
    "x{}y",
    "a}b",
    "with space",
    " lead and trail ",
    "ünïcødé:ключ:键",
    "emoji-🙂",
    b"\xff\xfe\x00binary{",
    b"\x00",
    "user:{123}:bloom",
]


def test_crc16_reference_vector():
    # The Redis Cluster specification's test vector for CRC16-CCITT (XMODEM).
    assert crc16(b"123456789") == 0x31C3


@pytest.mark.parametrize(
    ("key", "tag"),
    [("users", None), ("bf:{users}", b"users"), ("{}", None), ("{}{x}", None), ("{{x}}", b"{x"), ("a{b", None)],
)
def test_hash_tag_rules(key, tag):
    assert hash_tag(key) == tag


def test_documented_names():
    assert KeyFamily.of("users").standby == b"{users}:standby"
    assert KeyFamily.of("bf:{users}").standby == b"bf:{users}:standby"
    assert KeyFamily.of("bf:{users}").meta == b"bf:{users}:meta"
    assert KeyFamily.of("users").lock == b"{users}:lock"
    assert KeyFamily.of("users").old_meta == b"{users}:old:meta"


def test_companions_differ_from_each_other_and_the_active_key():
    for key in AWKWARD:
        names = list(KeyFamily.of(key).all_keys().values())
        assert len(set(names)) == len(names), key


def test_empty_key_is_refused():
    with pytest.raises(UsageError):
        KeyFamily.of("")


@pytest.mark.cluster
@pytest.mark.parametrize("key", AWKWARD, ids=repr)
def test_companions_share_the_slot_on_a_real_cluster(cluster, key):
    node = cluster.nodes[0].client()
    family = KeyFamily.of(key)
    expected = node.execute_command("CLUSTER KEYSLOT", family.active)
    assert key_slot(key) == expected
    for role, name in family.all_keys().items():
        assert node.execute_command("CLUSTER KEYSLOT", name) == expected, (role, name)


@pytest.mark.cluster
def test_companions_accept_multi_key_commands_on_a_cluster(cluster):
    """RENAME across the family works (no CROSSSLOT) for every awkward name."""
    client = cluster.client()
    for key in AWKWARD:
        family = KeyFamily.of(key)
        client.set(family.standby, b"x")
        client.rename(family.standby, family.old)
        assert client.get(family.old) == b"x"
        client.delete(family.old)
