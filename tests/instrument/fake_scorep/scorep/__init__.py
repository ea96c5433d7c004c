"""Test stand-in for Score-P's Python bindings (see ../README.md)."""
