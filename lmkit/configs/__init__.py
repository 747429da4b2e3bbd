"""The configs that come with lmkit, found by name: ``lmkit train --config config_small``.

Each is a plain Python module whose lowercase top-level names are the
config's sections (``model = dict(...)``, ``data = dict(...)``, ...; see
``lmkit/config/__init__.py``). The checkout also shows this folder as
``configs/``.
"""
