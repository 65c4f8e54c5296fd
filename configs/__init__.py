"""Config presets (TOML), installed as ``fastfair.presets`` so ``--config NAME`` works from any install."""
