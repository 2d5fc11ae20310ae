"""Batched serving: several requests decoded together, their verification rows in one forward, each
request reading its own slot of a pooled prefix KV store (docs/serving.md)."""

from .pool import KVPool, PoolExhausted

__all__ = ["KVPool", "PoolExhausted"]
