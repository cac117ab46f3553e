"""Data preparation tools; each also imports as `data_tools.NAME`."""
