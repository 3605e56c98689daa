"""Test doubles: fake kernel families that satisfy variants.base.Family and run on the CPU."""
