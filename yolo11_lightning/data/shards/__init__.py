"""Datasets as WebDataset tar shards plus a ``wids`` index per split (ARCHITECTURE.md, "Shards (object storage)")."""
