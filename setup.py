"""A shim for tools that still run ``python setup.py ...`` or ``pip install -e .`` without PEP 660.

Everything (name, version, dependencies, extras, packages) is in pyproject.toml.
"""
from setuptools import setup

setup()
