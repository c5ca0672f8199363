"""One module per `python -m bench NAME` scenario, each with `main(argv)`; they import bench.measure and harness,
never each other."""
