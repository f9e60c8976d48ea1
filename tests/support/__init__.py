"""Test support: local object-store servers, a fault-injecting proxy, pytest fixtures."""
