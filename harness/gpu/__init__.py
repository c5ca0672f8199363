"""The GPU check: the paged attention kernels and the engine against the reference on a CUDA device, and decode
speed (check.sh runs it on a rented machine; its dry mode runs in the suite on the CPU)."""
