"""Decoder LLMs (`kind: decoder` recipes): built with their KV cache, weight candidates, perplexity and speed
gates, and a selection by the recipe's workload."""
