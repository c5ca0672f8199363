"""What the scenarios share to measure: wrk load and its tables (load), the gateway hit targets (hits), on/off arms
across replicas (arms), the backend's prompts and our engine alone (engine), the memory roofline (roofline)."""
