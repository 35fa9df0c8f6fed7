"""Serving replicas and tools: the relay acting as their master."""
