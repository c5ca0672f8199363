"""The paged-KV inference engine: sequences, block pool, scheduler, model runner and the step loop."""
