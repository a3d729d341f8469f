"""Golden et al. (arXiv 2405.02803), settled: the study's run, grid, loop and figures."""
