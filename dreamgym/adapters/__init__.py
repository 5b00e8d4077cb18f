"""Adapters that let other RL engines train on dreamgym envs, the dream included (optional extras)."""
