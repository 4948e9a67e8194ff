"""The expert-operation benchmark: kernel timings, cache flushing, bandwidth fits (torch)."""
