"""The paged KV cache's bookkeeping now lives in `llmperf.serving.blocks` (torch-free, shared by the
engine and the simulator); this module re-exports it under its old name."""

from llmperf.serving.blocks import Block, BlockManager, BlockPool, BlockUsage, FreeBlockQueue, SlotResult

__all__ = ["Block", "BlockManager", "BlockPool", "BlockUsage", "FreeBlockQueue", "SlotResult"]
