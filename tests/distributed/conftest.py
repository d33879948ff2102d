"""The two hosts of the tests that cross a host boundary (tests/hosts.py)."""

import pytest
from hosts import two_hosts


@pytest.fixture
def hosts():
    """(node0, node1), each of its processes killed and its namespace removed after the test."""
    with two_hosts() as pair:
        yield pair
