"""Scoring a plan against measured runs under pre-registered rules (paper 002 Section 4).

numpy only. ``rules`` reads the committed rule set (``rules.json``, package data) and holds the
checks; ``score`` builds the three prediction versions and scores each configuration;
``result`` holds the validation as frozen dataclasses (``Validation``, ``ConfigurationScore``)
with validation.json as their ``to_dict()``/``from_dict()``.
"""
