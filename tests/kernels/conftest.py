"""Kernel tests: fresh random inputs on every run (the seed is printed with any failure)."""

import os

import pytest
import torch


@pytest.fixture
def seed() -> int:
    """A new seed per test and per run (tests/conftest.py's fixed seed is overridden here)."""
    value = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(value)
    return value
