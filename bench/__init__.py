"""tokenedge benchmarks: side-by-side comparisons, printed as tables with ratios."""
